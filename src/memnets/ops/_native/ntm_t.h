/* The body of ntm.c, included once per type (REAL, FN, EXP, LOG, LOG1P, SQRT, TANH). */

static inline REAL FN(ntm_softplus)(REAL x) { return x > 20 ? x : LOG1P(EXP(x)); } /* torch's threshold 20 */
static inline REAL FN(ntm_softplus_grad)(REAL x) { return x > 20 ? (REAL)1 : 1 / (1 + EXP(-x)); }
static inline REAL FN(ntm_sigmoid)(REAL x) { return 1 / (1 + EXP(-x)); }

/* max_i y[i], in sixteen lanes (a running maximum does not vectorise: the compiler keeps its order) */
static inline REAL FN(ntm_max)(const REAL *restrict y, long n)
{
    REAL lane[16], m = -INFINITY;
    for (long l = 0; l < 16; ++l) lane[l] = -INFINITY;
    long i = 0;
    for (; i + 16 <= n; i += 16)
        for (long l = 0; l < 16; ++l) lane[l] = y[i + l] > lane[l] ? y[i + l] : lane[l];
    for (long l = 0; l < 16; ++l) m = lane[l] > m ? lane[l] : m;
    for (; i < n; ++i) m = y[i] > m ? y[i] : m;
    return m;
}

/* y[i] = softmax_i(y[i]) over n numbers, in place */
static inline void FN(ntm_softmax)(REAL *restrict y, long n)
{
    const REAL m = FN(ntm_max)(y, n);
    REAL z = 0;
    /* two loops: GCC vectorises neither the exponential nor the sum when they share one */
    IVDEP for (long i = 0; i < n; ++i) y[i] = EXP(y[i] - m);
    IVDEP for (long i = 0; i < n; ++i) z += y[i];
    const REAL iz = 1 / z;
    IVDEP for (long i = 0; i < n; ++i) y[i] *= iz;
}

/* y[i] = softmax_i(scale * x[i]) over n numbers (y and x apart) */
static inline void FN(ntm_softmax_of)(REAL *restrict y, const REAL *restrict x, REAL scale, long n)
{
    IVDEP for (long i = 0; i < n; ++i) y[i] = scale * x[i];
    FN(ntm_softmax)(y, n);
}

/* A head's key k = tanh(p[:W]) into k; returns its norm sqrt(|k|^2 + eps). */
static inline REAL FN(ntm_key)(const REAL *restrict p, REAL *restrict k, long W, REAL eps)
{
    REAL kk = 0;
    for (long v = 0; v < W; ++v) {
        k[v] = TANH(p[v]);
        kk += k[v] * k[v];
    }
    return SQRT(kk + eps);
}

/* ext[q] = x[(q - n) mod N] for 0 <= q < N + 2n: x with n numbers of wrap-around on each side */
static inline void FN(ntm_extend)(REAL *restrict ext, const REAL *restrict x, long N, long n)
{
    for (long q = 0; q < n; ++q) ext[q] = x[ntm_wrap(q - n, N)];
    memcpy(ext + n, x, (size_t)N * sizeof(REAL));
    for (long q = 0; q < n; ++q) ext[N + n + q] = x[ntm_wrap(N + q, N)];
}

/* One head's weighting w [N] from its cosines (aux[:N], written by the caller), parameters p
 * [P] and previous weighting: content softmax, interpolation, circular shift, sharpening
 * (softmax of gamma log(w~ + 1e-12), as memnets.ops.addressing.sharpen). aux[N:4N] takes the
 * content, interpolated and shifted weightings; s [S] and ext [N + S] are scratch. */
static void FN(ntm_weighting)(REAL *restrict aux, const REAL *restrict p, const REAL *restrict wprev,
                              REAL *restrict w, REAL *restrict s, REAL *restrict ext, long N, long W, long S)
{
    const REAL *restrict cs = aux;
    REAL *restrict wc = aux + N, *restrict wg = aux + 2 * N, *restrict wt = aux + 3 * N;
    const REAL beta = FN(ntm_softplus)(p[W]), g = FN(ntm_sigmoid)(p[W + 1]);
    const REAL gamma = 1 + FN(ntm_softplus)(p[W + 2]);
    FN(ntm_softmax_of)(wc, cs, beta, N);
    for (long i = 0; i < N; ++i) wg[i] = g * wc[i] + (1 - g) * wprev[i];
    FN(ntm_softmax_of)(s, p + W + 3, 1, S);
    const long n = S / 2;
    /* wt[i] = sum_j s[j] wg[(i - j + n) mod N] = sum_j s[j] ext[i - j + 2n] */
    FN(ntm_extend)(ext, wg, N, n);
    for (long i = 0; i < N; ++i) wt[i] = 0;
    for (long j = 0; j < S; ++j) {
        const REAL sj = s[j], *restrict e = ext + 2 * n - j;
        IVDEP for (long i = 0; i < N; ++i) wt[i] += sj * e[i];
    }
    for (long i = 0; i < N; ++i) w[i] = (wt[i] > 0 ? wt[i] : 0) + (REAL)1e-12; /* apart: so both loops vectorise */
    IVDEP for (long i = 0; i < N; ++i) w[i] = gamma * LOG(w[i]);
    FN(ntm_softmax)(w, N);
}

/* The gradients of ntm_weighting: from dw [N] (its weighting's) to dp[W:P] and dwprev [N]
 * (written) and dcos [N], the cosines' (written). t2 [N], s, ds [S], ext [N + S] are scratch. */
static void FN(ntm_weighting_bwd)(const REAL *restrict aux, const REAL *restrict p, const REAL *restrict wprev,
                                  const REAL *restrict w, const REAL *restrict dw, REAL *restrict dp,
                                  REAL *restrict dwprev, REAL *restrict dcos, REAL *restrict t2, REAL *restrict s,
                                  REAL *restrict ds, REAL *restrict ext, long N, long W, long S)
{
    const REAL *restrict cs = aux, *restrict wc = aux + N, *restrict wg = aux + 2 * N, *restrict wt = aux + 3 * N;
    const REAL beta = FN(ntm_softplus)(p[W]), g = FN(ntm_sigmoid)(p[W + 1]);
    const REAL gamma = 1 + FN(ntm_softplus)(p[W + 2]);
    FN(ntm_softmax_of)(s, p + W + 3, 1, S);
    const long n = S / 2;
    REAL *restrict t1 = dcos; /* first d w~, then d cos */
    /* sharpening: w = softmax(gamma L), L = log(max(w~, 0) + 1e-12) */
    REAL c = 0, dgamma = 0;
    for (long i = 0; i < N; ++i) c += w[i] * dw[i];
    for (long i = 0; i < N; ++i) t2[i] = (wt[i] > 0 ? wt[i] : 0) + (REAL)1e-12; /* loops apart, as forward */
    IVDEP for (long i = 0; i < N; ++i) t1[i] = LOG(t2[i]);
    for (long i = 0; i < N; ++i) {
        const REAL dz = w[i] * (dw[i] - c);
        dgamma += dz * t1[i];
        t1[i] = wt[i] >= 0 ? dz * gamma / t2[i] : 0;
    }
    dp[W + 2] = dgamma * FN(ntm_softplus_grad)(p[W + 2]);
    /* circular shift: ds[j] = sum_i t1[i] wg[(i - j + n) mod N]; t2 = d wg,
     * t2[m] = sum_j s[j] t1[(m + j - n) mod N] */
    REAL sds = 0;
    FN(ntm_extend)(ext, wg, N, n);
    for (long j = 0; j < S; ++j) {
        const REAL *restrict e = ext + 2 * n - j;
        REAL a = 0;
        for (long i = 0; i < N; ++i) a += t1[i] * e[i];
        ds[j] = a;
        sds += s[j] * a;
    }
    for (long j = 0; j < S; ++j) dp[W + 3 + j] = s[j] * (ds[j] - sds);
    FN(ntm_extend)(ext, t1, N, n);
    for (long m = 0; m < N; ++m) t2[m] = 0;
    for (long j = 0; j < S; ++j) {
        const REAL sj = s[j], *restrict e = ext + j;
        IVDEP for (long m = 0; m < N; ++m) t2[m] += sj * e[m];
    }
    /* interpolation: t2 becomes d wc */
    REAL dg = 0;
    for (long i = 0; i < N; ++i) {
        dg += t2[i] * (wc[i] - wprev[i]);
        dwprev[i] = (1 - g) * t2[i];
        t2[i] *= g;
    }
    dp[W + 1] = dg * g * (1 - g);
    /* content softmax: d cos */
    REAL c2 = 0, dbeta = 0;
    for (long i = 0; i < N; ++i) c2 += wc[i] * t2[i];
    for (long i = 0; i < N; ++i) {
        const REAL du = wc[i] * (t2[i] - c2);
        dbeta += du * cs[i];
        t1[i] = beta * du;
    }
    dp[W] = dbeta * FN(ntm_softplus_grad)(p[W]);
}

/* mn[i] = sqrt(|M[i, :]|^2 + eps) of a memory stored transposed, MT [W, N] */
static inline void FN(ntm_norms)(const REAL *restrict MT, REAL *restrict mn, long N, long W, REAL eps)
{
    for (long i = 0; i < N; ++i) mn[i] = 0;
    for (long v = 0; v < W; ++v) {
        const REAL *restrict m = MT + v * N;
        IVDEP for (long i = 0; i < N; ++i) mn[i] += m[i] * m[i];
    }
    for (long i = 0; i < N; ++i) mn[i] = SQRT(mn[i] + eps);
}

/* cos[i] = M[i] . k / (kn mn[i]) into cs [N], for MT [W, N] */
static inline void FN(ntm_cosines)(const REAL *restrict MT, const REAL *restrict mn, const REAL *restrict k, REAL kn,
                                   REAL *restrict cs, long N, long W)
{
    for (long i = 0; i < N; ++i) cs[i] = 0;
    for (long v = 0; v < W; ++v) {
        const REAL kv = k[v], *restrict m = MT + v * N;
        IVDEP for (long i = 0; i < N; ++i) cs[i] += kv * m[i];
    }
    for (long i = 0; i < N; ++i) cs[i] /= kn * mn[i];
}

/* The gradient of ntm_cosines (dcos [N]) into the memory's, GT [W, N] (added), and the key's
 * dk [W] (written); returns the norm's part, -sum_i dcos[i] cos[i] (for dk += it k / kn^2).
 * t [N] is scratch. */
static REAL FN(ntm_cosines_bwd)(const REAL *restrict MT, const REAL *restrict mn, const REAL *restrict k, REAL kn,
                                const REAL *restrict cs, const REAL *restrict dcos, REAL *restrict GT,
                                REAL *restrict dk, REAL *restrict t, REAL *restrict tm, long N, long W)
{
    REAL dkn = 0;
    for (long i = 0; i < N; ++i) {
        t[i] = dcos[i] / (kn * mn[i]);              /* d dot */
        tm[i] = -dcos[i] * cs[i] / (mn[i] * mn[i]); /* d mn / mn */
        dkn -= dcos[i] * cs[i];
    }
    for (long v = 0; v < W; ++v) {
        const REAL kv = k[v], *restrict m = MT + v * N;
        REAL *restrict g = GT + v * N, a = 0;
        IVDEP for (long i = 0; i < N; ++i) {
            a += t[i] * m[i];
            g[i] += t[i] * kv + tm[i] * m[i];
        }
        dk[v] = a;
    }
    return dkn;
}

long FN(ntm_scratch)(long N, long W, long H, long S)
{
    return N * W + (2 * H + 6) * N + 2 * H * W + 2 * H + 4 * S;
}

/* Memories are stored transposed, [W, N] per batch row (M0T, M1T, and the gradients gM1T,
 * gM0T): every loop over the memory runs along the N slots. */
void FN(ntm_access_fwd)(long B, long N, long W, long R, long Hw, long S, double eps_, long b0, long b1,
                        const REAL *HP, const REAL *ER, const REAL *AD, const REAL *M0T, const REAL *WR0,
                        const REAL *WW0, REAL *M1T, REAL *WR1, REAL *WW1, REAL *RD, REAL *AUX, REAL *SCR)
{
    const REAL eps = (REAL)eps_;
    const long H = R + Hw, P = W + 3 + S, width = FN(ntm_scratch)(N, W, H, S);
    (void)B; /* rows b0 .. b1 of B: the caller checked every buffer's B rows */
    for (long b = b0; b < b1; ++b) {
        const REAL *restrict hp = HP + b * H * P, *restrict er = ER + b * Hw * W, *restrict ad = AD + b * Hw * W;
        const REAL *restrict m0 = M0T + b * N * W;
        REAL *restrict m1 = M1T + b * N * W, *restrict wr1 = WR1 + b * R * N, *restrict ww1 = WW1 + b * Hw * N;
        REAL *restrict aux = AUX + b * H * 4 * N, *restrict rd = RD + b * R * W;
        REAL *restrict K = SCR + b * width, *restrict kn = K + H * W, *restrict s = kn + H, *restrict ext = s + S;
        REAL *restrict mn = ext + N + S;
        for (long h = 0; h < H; ++h) kn[h] = FN(ntm_key)(hp + h * P, K + h * W, W, eps);
        /* the write heads address M_{t-1} */
        FN(ntm_norms)(m0, mn, N, W, eps);
        for (long h = R; h < H; ++h) {
            FN(ntm_cosines)(m0, mn, K + h * W, kn[h], aux + h * 4 * N, N, W);
            FN(ntm_weighting)(aux + h * 4 * N, hp + h * P, WW0 + (b * Hw + h - R) * N, ww1 + (h - R) * N, s, ext, N,
                              W, S);
        }
        /* erase, then add: M_t = M_{t-1} o prod_h (1 - w_h e_h^T) + sum_h w_h a_h^T */
        for (long v = 0; v < W; ++v) {
            const REAL *restrict m = m0 + v * N;
            REAL *restrict o = m1 + v * N;
            for (long i = 0; i < N; ++i) o[i] = m[i];
            for (long h = 0; h < Hw; ++h) {
                const REAL e = er[h * W + v], *restrict wh = ww1 + h * N;
                IVDEP for (long i = 0; i < N; ++i) o[i] *= 1 - wh[i] * e;
            }
            for (long h = 0; h < Hw; ++h) {
                const REAL a = ad[h * W + v], *restrict wh = ww1 + h * N;
                IVDEP for (long i = 0; i < N; ++i) o[i] += wh[i] * a;
            }
        }
        /* the read heads address M_t and read it */
        FN(ntm_norms)(m1, mn, N, W, eps);
        for (long h = 0; h < R; ++h) {
            FN(ntm_cosines)(m1, mn, K + h * W, kn[h], aux + h * 4 * N, N, W);
            FN(ntm_weighting)(aux + h * 4 * N, hp + h * P, WR0 + (b * R + h) * N, wr1 + h * N, s, ext, N, W, S);
            const REAL *restrict wh = wr1 + h * N;
            for (long v = 0; v < W; ++v) {
                const REAL *restrict m = m1 + v * N;
                REAL a = 0;
                for (long i = 0; i < N; ++i) a += wh[i] * m[i];
                rd[h * W + v] = a;
            }
        }
    }
}

void FN(ntm_access_bwd)(long B, long N, long W, long R, long Hw, long S, double eps_, long b0, long b1,
                        const REAL *HP, const REAL *ER, const REAL *AD, const REAL *M0T, const REAL *WR0,
                        const REAL *WW0, const REAL *M1T, const REAL *WR1, const REAL *WW1, const REAL *AUX,
                        const REAL *gM1T, const REAL *gWR1, const REAL *gWW1, const REAL *gRD, REAL *gHP, REAL *gER,
                        REAL *gAD, REAL *gM0T, REAL *gWR0, REAL *gWW0, REAL *SCR)
{
    const REAL eps = (REAL)eps_;
    const long H = R + Hw, P = W + 3 + S, width = FN(ntm_scratch)(N, W, H, S);
    (void)B;
    for (long b = b0; b < b1; ++b) {
        const REAL *restrict hp = HP + b * H * P, *restrict er = ER + b * Hw * W, *restrict ad = AD + b * Hw * W;
        const REAL *restrict m0 = M0T + b * N * W, *restrict m1 = M1T + b * N * W;
        const REAL *restrict wr1 = WR1 + b * R * N, *restrict ww1 = WW1 + b * Hw * N, *restrict aux = AUX + b * H * 4 * N;
        const REAL *restrict grd = gRD + b * R * W, *restrict gm1 = gM1T + b * N * W;
        REAL *restrict ghp = gHP + b * H * P, *restrict ger = gER + b * Hw * W, *restrict gad = gAD + b * Hw * W;
        REAL *restrict gm0 = gM0T + b * N * W;
        REAL *restrict G = SCR + b * width, *restrict dcos = G + N * W, *restrict dw = dcos + H * N;
        REAL *restrict t2 = dw + H * N, *restrict mn = t2 + N, *restrict t = mn + N, *restrict tm = t + N;
        REAL *restrict kp = tm + N, *restrict K = kp + N, *restrict dK = K + H * W, *restrict kn = dK + H * W;
        REAL *restrict dkn = kn + H, *restrict s = dkn + H, *restrict ds = s + S, *restrict ext = ds + S;
        for (long h = 0; h < H; ++h) kn[h] = FN(ntm_key)(hp + h * P, K + h * W, W, eps);
        /* M_t's gradient G: carried, plus the reads'; the read weightings' gradients */
        memcpy(G, gm1, (size_t)(N * W) * sizeof(REAL));
        for (long h = 0; h < R; ++h) {
            const REAL *restrict wh = wr1 + h * N, *restrict gw = gWR1 + (b * R + h) * N;
            REAL *restrict d = dw + h * N;
            for (long i = 0; i < N; ++i) d[i] = gw[i];
            for (long v = 0; v < W; ++v) {
                const REAL gr = grd[h * W + v], *restrict m = m1 + v * N;
                REAL *restrict g = G + v * N;
                IVDEP for (long i = 0; i < N; ++i) {
                    g[i] += wh[i] * gr;
                    d[i] += gr * m[i];
                }
            }
        }
        /* the read heads, adding their content addressing's part to G */
        FN(ntm_norms)(m1, mn, N, W, eps);
        for (long h = 0; h < R; ++h) {
            FN(ntm_weighting_bwd)(aux + h * 4 * N, hp + h * P, WR0 + (b * R + h) * N, wr1 + h * N, dw + h * N,
                                  ghp + h * P, gWR0 + (b * R + h) * N, dcos + h * N, t2, s, ds, ext, N, W, S);
            dkn[h] = FN(ntm_cosines_bwd)(m1, mn, K + h * W, kn[h], aux + h * 4 * N, dcos + h * N, G, dK + h * W, t,
                                         tm, N, W);
        }
        /* the erase/add write, M_t = M_{t-1} o prod_h (1 - w_h e_h^T) + sum_h w_h a_h^T */
        for (long h = 0; h < Hw; ++h) {
            const REAL *restrict gw = gWW1 + (b * Hw + h) * N;
            REAL *restrict d = dw + (R + h) * N;
            for (long i = 0; i < N; ++i) d[i] = gw[i];
        }
        for (long v = 0; v < W; ++v) {
            const REAL *restrict g = G + v * N, *restrict m = m0 + v * N;
            REAL *restrict go = gm0 + v * N;
            for (long i = 0; i < N; ++i) kp[i] = 1; /* prod_h (1 - w_h e_h[v]) */
            for (long h = 0; h < Hw; ++h) {
                const REAL e = er[h * W + v], *restrict wh = ww1 + h * N;
                IVDEP for (long i = 0; i < N; ++i) kp[i] *= 1 - wh[i] * e;
            }
            IVDEP for (long i = 0; i < N; ++i) go[i] = g[i] * kp[i];
            for (long h = 0; h < Hw; ++h) {
                const REAL e = er[h * W + v], a = ad[h * W + v], *restrict wh = ww1 + h * N;
                REAL *restrict d = dw + (R + h) * N;
                for (long i = 0; i < N; ++i) t[i] = 1; /* prod over the other heads */
                for (long o = 0; o < Hw; ++o) {
                    if (o == h) continue;
                    const REAL eo = er[o * W + v], *restrict wo = ww1 + o * N;
                    IVDEP for (long i = 0; i < N; ++i) t[i] *= 1 - wo[i] * eo;
                }
                REAL ge_sum = 0, ga_sum = 0;
                IVDEP for (long i = 0; i < N; ++i) {
                    const REAL ge = g[i] * m[i] * t[i]; /* G times d M_t / d (1 - w_h e_h) */
                    d[i] += g[i] * a - ge * e;
                    ge_sum += ge * wh[i];
                    ga_sum += g[i] * wh[i];
                }
                ger[h * W + v] = -ge_sum;
                gad[h * W + v] = ga_sum;
            }
        }
        /* the write heads, adding their content part to M_{t-1}'s gradient */
        FN(ntm_norms)(m0, mn, N, W, eps);
        for (long h = R; h < H; ++h) {
            FN(ntm_weighting_bwd)(aux + h * 4 * N, hp + h * P, WW0 + (b * Hw + h - R) * N, ww1 + (h - R) * N,
                                  dw + h * N, ghp + h * P, gWW0 + (b * Hw + h - R) * N, dcos + h * N, t2, s, ds, ext,
                                  N, W, S);
            dkn[h] = FN(ntm_cosines_bwd)(m0, mn, K + h * W, kn[h], aux + h * 4 * N, dcos + h * N, gm0, dK + h * W, t,
                                         tm, N, W);
        }
        /* the keys: dk + dkn k / kn^2 through tanh */
        for (long h = 0; h < H; ++h) {
            const REAL *restrict k = K + h * W, *restrict dk = dK + h * W, f = dkn[h] / (kn[h] * kn[h]);
            REAL *restrict dp = ghp + h * P;
            for (long v = 0; v < W; ++v) dp[v] = (dk[v] + f * k[v]) * (1 - k[v] * k[v]);
        }
    }
}
