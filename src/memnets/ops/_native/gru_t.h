/* The body of gru.c, included once per type (REAL, FN, EXP, TANH). */

/* r, z = sigma(gx + gh); n = tanh(gx_n + r * gh_n); h' = n + z (h - n). Saves r, z, n and
 * gh_n; h (the state the step starts from) becomes h', also written to HS. */
void FN(gru_fwd_step)(long D, long B, long T, long H, long t, int reverse, const REAL *gx,
                      const REAL *gh, REAL *RZ, REAL *NN, REAL *GHN, REAL *HS, REAL *h)
{
    for (long d = 0; d < D; ++d) {
        const long tau = reverse && d == 1 ? T - 1 - t : t;
        for (long b = 0; b < B; ++b) {
            const long row = (d * B + b) * T + tau, db = d * B + b;
            if (b + 2 < B) { /* rows of this step lie T rows apart: ask for those of b + 2 early */
                const long r2 = row + 2 * T;
                PREFETCH_ROW(gx + r2 * 3 * H, 3 * H * sizeof(REAL), 0);
                PREFETCH_ROW(RZ + r2 * 2 * H, 2 * H * sizeof(REAL), 1);
                PREFETCH_ROW(NN + r2 * H, H * sizeof(REAL), 1);
                PREFETCH_ROW(GHN + r2 * H, H * sizeof(REAL), 1);
                PREFETCH_ROW(HS + ((db + 2) * (T + 2) + tau + 1) * H, H * sizeof(REAL), 1);
            }
            const REAL *restrict g = gx + row * 3 * H, *restrict gg = gh + db * 3 * H;
            REAL *restrict rz = RZ + row * 2 * H, *restrict nn = NN + row * H;
            REAL *restrict ghn = GHN + row * H, *restrict hs = HS + (db * (T + 2) + tau + 1) * H;
            REAL *restrict hr = h + db * H;
            IVDEP for (long j = 0; j < 2 * H; ++j) rz[j] = 1 / (1 + EXP(-(g[j] + gg[j])));
            IVDEP for (long j = 0; j < H; ++j) {
                const REAL gn = gg[2 * H + j];
                const REAL n = TANH(g[2 * H + j] + rz[j] * gn);
                const REAL hn = n + rz[H + j] * (hr[j] - n);
                ghn[j] = gn;
                nn[j] = n;
                hr[j] = hn;
                hs[j] = hn;
            }
        }
    }
}

/* From dh (the gradient of the state after the step): the gradients of the pre-activations,
 * (dr, dz, dn r) into DGH and dg (for the product with W_hh), dn into DN, and
 * direct = dh z + dO of the previous step (the state's gradient other than through W_hh). */
void FN(gru_bwd_step)(long D, long B, long T, long H, long t, int reverse, const REAL *dO,
                      const REAL *RZ, const REAL *NN, const REAL *GHN, const REAL *HS,
                      const REAL *dh, REAL *DGH, REAL *DN, REAL *dg, REAL *direct)
{
    for (long d = 0; d < D; ++d) {
        const int rev = reverse && d == 1;
        const long tau = rev ? T - 1 - t : t, taup = rev ? tau + 1 : tau - 1;
        for (long b = 0; b < B; ++b) {
            const long row = (d * B + b) * T + tau, db = d * B + b;
            if (b + 2 < B) { /* as in the forward step */
                const long r2 = row + 2 * T;
                PREFETCH_ROW(RZ + r2 * 2 * H, 2 * H * sizeof(REAL), 0);
                PREFETCH_ROW(NN + r2 * H, H * sizeof(REAL), 0);
                PREFETCH_ROW(GHN + r2 * H, H * sizeof(REAL), 0);
                PREFETCH_ROW(HS + ((db + 2) * (T + 2) + tau + (rev ? 2 : 0)) * H, H * sizeof(REAL), 0);
                PREFETCH_ROW(DGH + r2 * 3 * H, 3 * H * sizeof(REAL), 1);
                PREFETCH_ROW(DN + r2 * H, H * sizeof(REAL), 1);
                if (t > 0) PREFETCH_ROW(dO + (r2 - tau + taup) * H, H * sizeof(REAL), 0);
            }
            const REAL *restrict rz = RZ + row * 2 * H, *restrict nn = NN + row * H;
            const REAL *restrict ghn = GHN + row * H, *restrict dhr = dh + db * H;
            const REAL *restrict hp = HS + (db * (T + 2) + tau + (rev ? 2 : 0)) * H; /* the state before */
            const REAL *restrict dop = t > 0 ? dO + ((d * B + b) * T + taup) * H : NULL;
            REAL *restrict dgh = DGH + row * 3 * H, *restrict dn_ = DN + row * H;
            REAL *restrict dgr = dg + db * 3 * H, *restrict dir = direct + db * H;
            IVDEP for (long j = 0; j < H; ++j) {
                const REAL r = rz[j], z = rz[H + j], n = nn[j], x = dhr[j];
                const REAL dn = x * (1 - z) * (1 - n * n);
                const REAL gr = dn * ghn[j] * r * (1 - r), gz = x * (hp[j] - n) * z * (1 - z), gn = dn * r;
                dn_[j] = dn;
                dgh[j] = gr; dgh[H + j] = gz; dgh[2 * H + j] = gn;
                dgr[j] = gr; dgr[H + j] = gz; dgr[2 * H + j] = gn;
                dir[j] = x * z + (dop ? dop[j] : 0);
            }
        }
    }
}
