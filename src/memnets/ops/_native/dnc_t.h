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
