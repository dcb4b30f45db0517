/* The body of dnc.c, included once per type (REAL, FN, EXP, LOG1P, SQRT). */

/* softmax of n numbers x[i * stride] (scaled by s[i] when s is not NULL) into y[i * stride] */
static inline void FN(dnc_softmax)(REAL *restrict y, const REAL *restrict x, const REAL *restrict s, long n,
                                   long stride)
{
    REAL m = -INFINITY, z = 0;
    if (s) {
        for (long i = 0; i < n; ++i) y[i * stride] = x[i * stride] * s[i];
    } else {
        for (long i = 0; i < n; ++i) y[i * stride] = x[i * stride];
    }
    for (long i = 0; i < n; ++i) m = y[i * stride] > m ? y[i * stride] : m;
    for (long i = 0; i < n; ++i) {
        const REAL e = EXP(y[i * stride] - m);
        y[i * stride] = e;
        z += e;
    }
    const REAL iz = 1 / z;
    for (long i = 0; i < n; ++i) y[i * stride] *= iz;
}

void FN(dnc_access_fwd)(long B, long N, long W, long R, long I, long XW, long t, double eps_, long b0, long b1,
                        const REAL *XI, REAL *SP, REAL *SG, REAL *PI, REAL *KH, REAL *RHO, REAL *KEEPR,
                        REAL *PSI, REAL *UB, REAL *U, REAL *SU, int64_t *PHI, REAL *EX, REAL *S0W, REAL *CW,
                        REAL *DI, REAL *WW, REAL *KEEPM, REAL *MEM, REAL *DEC, REAL *LL, REAL *SW, REAL *PREC,
                        REAL *BF, REAL *CR, REAL *NRM, REAL *S0R, REAL *WR, REAL *RD, REAL *X0, REAL *alloc)
{
    const REAL eps = (REAL)eps_;
    const long STR = (R + 1) * W, V = STR + R + 1, SIG = V + W, MODES = SIG + W + R + 2, N2 = 2 * N;
    for (long b = b0; b < b1; ++b) {
        const long tb = t * B + b, nb = (t + 1) * B + b; /* step t's rows, and the state after it */
        const REAL *restrict xi = XI + tb * I;
        REAL *restrict sp = SP + tb * (R + 1), *restrict sg = SG + tb * (W + R + 2), *restrict pi = PI + tb * 3 * R;
        REAL *restrict kh = KH + tb * (R + 1) * W, *restrict rho = RHO + tb * (R + 1);
        /* strengths (softplus, threshold 20 as torch's), the sigmoid block, read modes over the 3 */
        for (long i = 0; i <= R; ++i) {
            const REAL x = xi[STR + i];
            sp[i] = x > 20 ? x : LOG1P(EXP(x));
        }
        IVDEP for (long i = 0; i < W + R + 2; ++i) sg[i] = 1 / (1 + EXP(-xi[SIG + i]));
        for (long r = 0; r < R; ++r) FN(dnc_softmax)(pi + r, xi + MODES + r, NULL, 3, R);
        /* keys: k^ = (1 + softplus) rho k, rho = 1 / sqrt(|k|^2 + eps) */
        for (long i = 0; i <= R; ++i) {
            const REAL *restrict k = xi + i * W;
            REAL s = 0;
            for (long w = 0; w < W; ++w) s += k[w] * k[w];
            const REAL rh = 1 / SQRT(s + eps), f = rh + sp[i] * rh;
            rho[i] = rh;
            for (long w = 0; w < W; ++w) kh[i * W + w] = k[w] * f;
        }
        const REAL *restrict e = sg, *restrict fr = sg + W, ga = sg[W + R], gw = sg[W + R + 1];
        const REAL *restrict v = xi + V;
        /* the state the step starts from */
        const REAL *restrict up = U + tb * N, *restrict wwp = WW + tb * N, *restrict mp = MEM + tb * N * W;
        const REAL *restrict lp = LL + tb * N * N2, *restrict pp = PREC + tb * N, *restrict wrp = WR + tb * R * N;
        const REAL *restrict nrmp = NRM + tb * N;
        /* retention psi = prod_r (1 - f_r w^r_{t-1}), usage */
        REAL *restrict keepr = KEEPR + tb * R * N, *restrict psi = PSI + tb * N, *restrict ub = UB + tb * N;
        REAL *restrict u = U + nb * N;
        for (long n = 0; n < N; ++n) psi[n] = 1;
        for (long r = 0; r < R; ++r)
            for (long n = 0; n < N; ++n) {
                keepr[r * N + n] = 1 - fr[r] * wrp[r * N + n];
                psi[n] *= keepr[r * N + n];
            }
        for (long n = 0; n < N; ++n) {
            ub[n] = up[n] + wwp[n] - up[n] * wwp[n];
            u[n] = ub[n] * psi[n];
        }
        /* allocation: u sorted ascending (stable: ties keep slot order), ex_k = prod_{i<k} su_i */
        REAL *restrict su = SU + tb * N, *restrict ex = EX + tb * N, *restrict al = alloc + b * N;
        int64_t *restrict phi = PHI + tb * N;
        for (long k = 0; k < N; ++k) {
            const REAL x = u[k];
            long j = k;
            while (j > 0 && su[j - 1] > x) {
                su[j] = su[j - 1];
                phi[j] = phi[j - 1];
                --j;
            }
            su[j] = x;
            phi[j] = k;
        }
        ex[0] = 1;
        for (long k = 1; k < N; ++k) ex[k] = ex[k - 1] * su[k - 1];
        for (long k = 0; k < N; ++k) al[phi[k]] = ex[k] - su[k] * ex[k];
        /* write content weighting on M_{t-1}, write weighting */
        REAL *restrict s0w = S0W + tb * N, *restrict cw = CW + tb * N, *restrict di = DI + tb * 2 * N;
        REAL *restrict ww = WW + nb * N;
        const REAL *restrict khw = kh + R * W;
        for (long n = 0; n < N; ++n) {
            REAL s = 0;
            for (long w = 0; w < W; ++w) s += mp[n * W + w] * khw[w];
            s0w[n] = s;
        }
        FN(dnc_softmax)(cw, s0w, nrmp, N, 1);
        for (long n = 0; n < N; ++n) {
            di[n] = al[n] - cw[n];
            di[N + n] = cw[n] + di[n] * ga;
            ww[n] = di[N + n] * gw;
        }
        /* erase/add write */
        REAL *restrict keepm = KEEPM + tb * N * W, *restrict m = MEM + nb * N * W;
        for (long n = 0; n < N; ++n)
            IVDEP for (long w = 0; w < W; ++w) {
                keepm[n * W + w] = 1 - ww[n] * e[w];
                m[n * W + w] = mp[n * W + w] * keepm[n * W + w] + ww[n] * v[w];
            }
        /* link (off the diagonal), precedence; LL row i = [L[i, :] | L[:, i]] */
        REAL *restrict dec = DEC + tb * N * N, *restrict ll = LL + nb * N * N2, *restrict p = PREC + nb * N;
        REAL sw = 0;
        for (long n = 0; n < N; ++n) sw += ww[n];
        SW[tb] = sw;
        for (long i = 0; i < N; ++i)
            IVDEP for (long j = 0; j < N; ++j) {
                const REAL d = ww[i] + ww[j], l = lp[i * N2 + j];
                dec[i * N + j] = d;
                ll[i * N2 + j] = i == j ? 0 : l - l * d + ww[i] * pp[j];
            }
        for (long i = 0; i < N; ++i)
            for (long j = 0; j < N; ++j) ll[i * N2 + N + j] = ll[j * N2 + i];
        for (long n = 0; n < N; ++n) p[n] = pp[n] - pp[n] * sw + ww[n];
        /* directional weightings: bf[r, :] = w^r_{t-1} [L | L^T] */
        REAL *restrict bf = BF + tb * R * N2;
        for (long r = 0; r < R; ++r) {
            REAL *restrict o = bf + r * N2;
            for (long j = 0; j < N2; ++j) o[j] = 0;
            for (long i = 0; i < N; ++i) {
                const REAL a = wrp[r * N + i];
                const REAL *restrict row = ll + i * N2;
                IVDEP for (long j = 0; j < N2; ++j) o[j] += a * row[j];
            }
        }
        /* row norms of M_t, read content weighting, read weightings, reads */
        REAL *restrict nrm = NRM + nb * N, *restrict s0r = S0R + tb * R * N, *restrict cr = CR + tb * R * N;
        REAL *restrict wr = WR + nb * R * N, *restrict x0 = X0 + nb * XW;
        for (long n = 0; n < N; ++n) {
            REAL s = 0;
            for (long w = 0; w < W; ++w) s += m[n * W + w] * m[n * W + w];
            nrm[n] = 1 / SQRT(s + eps);
        }
        for (long r = 0; r < R; ++r) {
            const REAL *restrict k = kh + r * W;
            for (long n = 0; n < N; ++n) {
                REAL s = 0;
                for (long w = 0; w < W; ++w) s += k[w] * m[n * W + w];
                s0r[r * N + n] = s;
            }
            FN(dnc_softmax)(cr + r * N, s0r + r * N, nrm, N, 1);
            const REAL p0 = pi[r], p1 = pi[R + r], p2 = pi[2 * R + r];
            for (long n = 0; n < N; ++n)
                wr[r * N + n] = bf[r * N2 + n] * p0 + cr[r * N + n] * p1 + bf[r * N2 + N + n] * p2;
            REAL *restrict rd = RD + (tb * R + r) * W;
            for (long w = 0; w < W; ++w) rd[w] = 0;
            for (long n = 0; n < N; ++n) {
                const REAL a = wr[r * N + n];
                IVDEP for (long w = 0; w < W; ++w) rd[w] += a * m[n * W + w];
            }
            memcpy(x0 + r * W, rd, sizeof(REAL) * W);
        }
    }
}

/* The reverse step t of memnets.ops.dnc.backward's loop, the access part, for batch rows
 * b0 <= b < b1: from the gradient of the step's reads (EXT0[t, b, :R*W]) and the carried
 * gradients of the state after the step (gM [B,N,W], gu, gp, gww, gn [B,N], gL [B,N,N],
 * gwr [B,R,N]; updated in place to the state before it), the gradient of the step's interface
 * vector into GXI[t] (the sigmoid block scaled by SGD). The factors that depend on forward
 * values only (S0RN, S0WN, Q, OMSW, FU, FW, NOTH, JS, CWC, SGD, RSP, BR, NBR3) are the ones
 * backward.py computes for all steps before its loop. WORK: per row N W + N N + 2 R N + (R + 1) W
 * + 5 N numbers of scratch (memnets.ops.dnc.native.backward_scratch). */
void FN(dnc_access_bwd)(long B, long N, long W, long R, long I, long EW, long t, long b0, long b1,
                        const REAL *XI, const REAL *SG, const REAL *PI, const REAL *KH, const REAL *MEM,
                        const REAL *WR, const REAL *BF, const REAL *CR, const REAL *NRM, const REAL *LL,
                        const REAL *DEC, const REAL *WW, const REAL *PREC, const REAL *KEEPM, const REAL *DI,
                        const int64_t *PHI, const REAL *CW, const REAL *S0RN, const REAL *S0WN, const REAL *Q,
                        const REAL *OMSW, const REAL *FU, const REAL *FW, const REAL *NOTH, const REAL *JS,
                        const REAL *CWC, const REAL *SGD, const REAL *RSP, const REAL *BR, const REAL *NBR3,
                        const REAL *EXT0, REAL *GXI, REAL *GM, REAL *GU, REAL *GL, REAL *GP, REAL *GWR,
                        REAL *GWW, REAL *GN, REAL *WORK)
{
    const long STR = (R + 1) * W, V = STR + R + 1, SIG = V + W, FREE = SIG + W, GA = FREE + R, GW = GA + 1,
               MODES = GW + 1, N2 = 2 * N, WK = N * W + N * N + 2 * R * N + (R + 1) * W + 5 * N;
    for (long b = b0; b < b1; ++b) {
        const long tb = t * B + b, nb = (t + 1) * B + b;
        const REAL *restrict m1 = MEM + nb * N * W, *restrict m0 = MEM + tb * N * W;
        const REAL *restrict wr1 = WR + nb * R * N, *restrict wr0 = WR + tb * R * N;
        const REAL *restrict bf = BF + tb * R * N2, *restrict cr = CR + tb * R * N, *restrict pi = PI + tb * 3 * R;
        const REAL *restrict nrm1 = NRM + nb * N, *restrict nrm0 = NRM + tb * N;
        const REAL *restrict kh = KH + tb * (R + 1) * W, *restrict khw = kh + R * W;
        const REAL *restrict ll1 = LL + nb * N * N2, *restrict ll0 = LL + tb * N * N2;
        const REAL *restrict dec = DEC + tb * N * N, *restrict ww1 = WW + nb * N, *restrict p0 = PREC + tb * N;
        const REAL *restrict keepm = KEEPM + tb * N * W, *restrict di = DI + tb * 2 * N, *restrict cw = CW + tb * N;
        const int64_t *restrict phi = PHI + tb * N;
        const REAL *restrict xi = XI + tb * I, *restrict v = xi + V, *restrict sg = SG + tb * (W + R + 2);
        const REAL *restrict e = sg, *restrict fr = sg + W;
        const REAL *restrict s0rn = S0RN + tb * R * N, *restrict s0wn = S0WN + tb * N, *restrict q = Q + tb * N * N;
        const REAL omsw = OMSW[tb], cwc = CWC[tb];
        const REAL *restrict fu = FU + tb * N, *restrict fw = FW + tb * N, *restrict noth = NOTH + tb * R * N;
        const REAL *restrict js = JS + tb * N * N, *restrict sgd = SGD + tb * (W + R + 2);
        const REAL *restrict rsp = RSP + tb * (R + 1), *restrict br = BR + tb * (R + 1);
        const REAL *restrict nbr3 = NBR3 + tb * (R + 1);
        const REAL *restrict gr = EXT0 + tb * EW;
        REAL *restrict gxi = GXI + tb * I;
        REAL *restrict gM = GM + b * N * W, *restrict gu = GU + b * N, *restrict gL = GL + b * N * N;
        REAL *restrict gp = GP + b * N, *restrict gwr = GWR + b * R * N, *restrict gww = GWW + b * N;
        REAL *restrict gn = GN + b * N;
        /* scratch: the state's gradients before the step, GKH, and rows of N */
        REAL *restrict gMp = WORK + b * WK, *restrict gLp = gMp + N * W, *restrict gwrp = gLp + N * N;
        REAL *restrict gkh = gwrp + R * N, *restrict gS0 = gkh + (R + 1) * W, *restrict gcw = gS0 + R * N;
        REAL *restrict ds = gcw + N, *restrict gpl = ds + N, *restrict gnp = gpl + N;
        /* reads r_t = w^r_t M_t */
        for (long r = 0; r < R; ++r)
            for (long n = 0; n < N; ++n) {
                REAL s = 0;
                for (long w = 0; w < W; ++w) s += gr[r * W + w] * m1[n * W + w];
                gwr[r * N + n] += s;
            }
        for (long n = 0; n < N; ++n)
            for (long r = 0; r < R; ++r) {
                const REAL a = wr1[r * N + n];
                IVDEP for (long w = 0; w < W; ++w) gM[n * W + w] += a * gr[r * W + w];
            }
        /* read weighting w^r = pi0 b + pi1 c + pi2 f: read modes, and the read content softmax */
        for (long r = 0; r < R; ++r) {
            const REAL *restrict g = gwr + r * N;
            REAL gp0 = 0, gp1 = 0, gp2 = 0;
            for (long n = 0; n < N; ++n) {
                gp0 += bf[r * N2 + n] * g[n];
                gp1 += cr[r * N + n] * g[n];
                gp2 += bf[r * N2 + N + n] * g[n];
            }
            const REAL a0 = pi[r], a1 = pi[R + r], a2 = pi[2 * R + r], s = a0 * gp0 + a1 * gp1 + a2 * gp2;
            gxi[MODES + r] = a0 * (gp0 - s);
            gxi[MODES + R + r] = a1 * (gp1 - s);
            gxi[MODES + 2 * R + r] = a2 * (gp2 - s);
            REAL sc = 0;
            for (long n = 0; n < N; ++n) sc += cr[r * N + n] * g[n] * a1;
            for (long n = 0; n < N; ++n) {
                const REAL gsn = cr[r * N + n] * (g[n] * a1 - sc);
                gn[n] += gsn * s0rn[r * N + n];
                gS0[r * N + n] = gsn * nrm1[n];
            }
        }
        for (long r = 0; r < R; ++r)
            for (long w = 0; w < W; ++w) {
                REAL s = 0;
                for (long n = 0; n < N; ++n) s += gS0[r * N + n] * m1[n * W + w];
                gkh[r * W + w] = s;
            }
        for (long n = 0; n < N; ++n) {
            for (long r = 0; r < R; ++r) {
                const REAL a = gS0[r * N + n];
                IVDEP for (long w = 0; w < W; ++w) gM[n * W + w] += a * kh[r * W + w];
            }
            IVDEP for (long w = 0; w < W; ++w) gM[n * W + w] += m1[n * W + w] * gn[n];
        }
        /* directional weightings [b | f] = w^r_{t-1} [L | L^T] */
        for (long r = 0; r < R; ++r) {
            const REAL a0 = pi[r], a2 = pi[2 * R + r];
            for (long i = 0; i < N; ++i) {
                REAL s0 = 0, s2 = 0;
                for (long j = 0; j < N; ++j) {
                    s0 += gwr[r * N + j] * ll1[i * N2 + j];
                    s2 += gwr[r * N + j] * ll1[i * N2 + N + j];
                }
                gwrp[r * N + i] = a0 * s0 + a2 * s2;
            }
        }
        for (long r = 0; r < R; ++r) {
            const REAL a0 = pi[r], a2 = pi[2 * R + r];
            for (long i = 0; i < N; ++i) {
                const REAL zi = a0 * wr0[r * N + i], gi = gwr[r * N + i];
                IVDEP for (long j = 0; j < N; ++j) gL[i * N + j] += zi * gwr[r * N + j] + gi * a2 * wr0[r * N + j];
            }
        }
        /* link: L_t = (1 - w_i - w_j) L_{t-1} + w_i p_{t-1}[j], off the diagonal */
        for (long j = 0; j < N; ++j) gpl[j] = 0;
        for (long i = 0; i < N; ++i) {
            REAL rowq = 0;
            for (long j = 0; j < N; ++j) {
                const REAL G = i == j ? 0 : gL[i * N + j];
                gLp[i * N + j] = G - G * dec[i * N + j];
                rowq += G * q[i * N + j];
                gpl[j] += ww1[i] * G;
            }
            gww[i] += rowq;
        }
        for (long j = 0; j < N; ++j) {
            REAL colL = 0;
            for (long i = 0; i < N; ++i) colL += (i == j ? 0 : gL[i * N + j]) * ll0[i * N2 + j];
            gww[j] -= colL;
        }
        /* precedence */
        REAL gpp = 0;
        for (long n = 0; n < N; ++n) gpp += gp[n] * p0[n];
        for (long n = 0; n < N; ++n) gww[n] += gp[n] - gpp;
        for (long n = 0; n < N; ++n) gp[n] = gp[n] * omsw + gpl[n];
        /* erase/add write M_t = M_{t-1} (1 - w e^T) + w v^T */
        REAL *restrict gv = gxi + V, *restrict ge = gxi + SIG;
        for (long w = 0; w < W; ++w) { gv[w] = 0; ge[w] = 0; }
        for (long n = 0; n < N; ++n) {
            REAL s = 0;
            const REAL a = ww1[n];
            for (long w = 0; w < W; ++w) {
                const REAL g = gM[n * W + w], gm = g * m0[n * W + w];
                s += g * v[w] - gm * e[w];
                gv[w] += a * g;
                ge[w] += a * gm;
                gMp[n * W + w] = g * keepm[n * W + w];
            }
            gww[n] += s;
        }
        /* write weighting w^w = g_w (g_a a + (1 - g_a) c) */
        REAL sa = 0, si = 0;
        for (long n = 0; n < N; ++n) {
            sa += di[n] * gww[n];
            si += di[N + n] * gww[n];
            gcw[n] = gww[n] * cwc;
        }
        gxi[GA] = sa;
        gxi[GW] = si;
        /* allocation, in sorted order: d s = J_s d a[phi]; d u[phi] += d s */
        for (long j = 0; j < N; ++j) {
            REAL s = 0;
            for (long k = 0; k < N; ++k) s += js[j * N + k] * gww[phi[k]];
            ds[j] = s;
        }
        for (long j = 0; j < N; ++j) gu[phi[j]] += ds[j];
        /* write content weighting on M_{t-1} */
        REAL sc = 0;
        for (long n = 0; n < N; ++n) sc += cw[n] * gcw[n];
        for (long n = 0; n < N; ++n) {
            const REAL gsw = cw[n] * (gcw[n] - sc);
            gnp[n] = gsw * s0wn[n];
            gcw[n] = gsw * nrm0[n]; /* gS0w */
        }
        REAL *restrict gkhw = gkh + R * W;
        for (long w = 0; w < W; ++w) {
            REAL s = 0;
            for (long n = 0; n < N; ++n) s += m0[n * W + w] * gcw[n];
            gkhw[w] = s;
        }
        for (long n = 0; n < N; ++n) {
            const REAL a = gcw[n];
            IVDEP for (long w = 0; w < W; ++w) gMp[n * W + w] += a * khw[w];
        }
        /* usage u_t = u-bar psi, retention psi = prod_r (1 - f_r w^r_{t-1}) */
        for (long r = 0; r < R; ++r) {
            REAL s = 0;
            for (long n = 0; n < N; ++n) {
                const REAL gk = gu[n] * noth[r * N + n];
                s += gk * wr0[r * N + n];
                gwrp[r * N + n] += gk * fr[r];
            }
            gxi[FREE + r] = s;
        }
        for (long n = 0; n < N; ++n) {
            gww[n] = gu[n] * fw[n];
            gu[n] = gu[n] * fu[n];
        }
        /* keys k^ = beta rho k */
        for (long i = 0; i <= R; ++i) {
            const REAL *restrict k = xi + i * W, *restrict g = gkh + i * W;
            REAL s = 0;
            for (long w = 0; w < W; ++w) s += g[w] * k[w];
            gxi[STR + i] = s * rsp[i];
            const REAL c = s * nbr3[i];
            for (long w = 0; w < W; ++w) gxi[i * W + w] = g[w] * br[i] + k[w] * c;
        }
        for (long k = 0; k < W + R + 2; ++k) gxi[SIG + k] *= sgd[k];
        /* the state's gradients before the step */
        memcpy(gM, gMp, sizeof(REAL) * N * W);
        memcpy(gL, gLp, sizeof(REAL) * N * N);
        memcpy(gwr, gwrp, sizeof(REAL) * R * N);
        memcpy(gn, gnp, sizeof(REAL) * N);
    }
}
