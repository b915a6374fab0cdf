; fast512.asm: the AVX-512F level of the hot kernels, chosen by cpu.asm where the CPU and the
; OS have AVX-512F (and --avx2 does not ask for the AVX2 level). Their results are fast.asm's,
; bit for bit: one zmm accumulator per (row, token) holds matmul_f16_avx2's two chains (lanes
; 0-7 chain 0, lanes 8-15 chain 1), so 16 consecutive weights are converted at once and every
; lane gets the same fused multiply-adds in the same order; the sums go through the same
; tree. Addresses carry no displacement (keystone mis-encodes EVEX displacements; the builder
; refuses them).

; matmul_f16_avx512 and matmul_q8_avx512 (fast.asm: a nop before matmul_f16_avx2 and
; matmul_q8_avx2, which take k = 8 to tile8): the AVX2 kernels' products, prompt
; blocks (k = 8) three rows at a time by eight tokens (tile8): each load of 16 x columns serves
; three rows and each converted weight eight tokens, 24 accumulators (against four rows by
; four tokens: 2b FP16 prompt 1.06x, Q8_0 1.17x, AVX-512 Intel host, 2026-12-05). Other k
; (1..4) in the AVX2 kernels' own code (decode, k = 1, streams no faster in zmm registers:
; measured on an AVX-512 host, 2026-12-03; Q8_0 decode by matmul_q8_avx2's pairs of rows: a
; zmm pass over rows i and i + d/2 decoded 1.08-1.11x faster on the AVX-512 host (2026-12-05)
; but took 97 packed bytes: tile8's price). The shared entries: 33 image bytes, 6-7 packed
; less than entries of their own (6 layouts, 2026-12-06).
; tile8: matmul_f16_avx512's and matmul_q8_avx512's prompt blocks (k = 8): three rows a-c at
; a time; the loader (rcx) puts each row's next 16 weights in zmm4-6 (rows b, c rbx, rbp
; bytes on; past the last row, row a or b again, their sums not stored), x in zmm7 (they
; pack smaller than zmm20-23 did); 24 accumulators: tokens 0-3 of rows a, b, c in zmm0-3,
; zmm8-11, zmm12-15, tokens 4-7 in zmm16-19, zmm24-27, zmm28-31. Then each row's sums, four
; tokens at a time (.half): the upper halves (chain 1) into ymm4-7 and
; matmul_f16_avx2.sum_row (fast.asm: its order, its stores). (k != 8: the AVX2 kernels' own
; code.) The loader: the AVX2 one the entry chose (matmul_f16_avx2.f16 or .q8) moved by
; f16_rows3 - .f16, which is q8_rows3 - .q8 too (.f16 and f16_rows3 take 25 bytes each;
; Q8_0's k = 8 tests fail if not).
;   in: as matmul_f16_avx2 (k = 8), and rcx the AVX2 loader, r10 s (bytes of an x_t), r11
;   bytes of a row of W (from its .go)
;   out, clobbers: as matmul_f16_avx2 (and zmm16-31)
TILE8_ROWS = 3                          ; rows a tile8 pass takes
tile8:
        push    rbx
        push    rbp
        push    r12
        add     rcx, f16_rows3 - matmul_f16_avx2.f16 ; the loader
        push    qword [rsp+40]          ; ostride, k = 4, a slot and accumulate: the frame
        push    FAST_TOKENS             ; matmul_f16_avx2.sum_row reads (its .go's: k at
        push    rax                     ; [rsp+16], ostride at [rsp+24]; rsp 0 mod 16 at the
        push    r9                      ; calls)
        lea     r12, [r10+r10*2]        ; 3s
.tri:
        xor     ebx, ebx                ; rows b, c: rbx, rbp bytes on (one row left:
        cmp     r8d, 2                  ; b = c = a; two: c = b)
        cmovae  rbx, r11
        mov     rbp, rbx
        jbe     .strided
        add     rbp, r11
.strided:
        vzeroall                        ; the accumulators
        vmovaps zmm16, zmm0
        vmovaps zmm17, zmm0
        vmovaps zmm18, zmm0
        vmovaps zmm19, zmm0
        vmovaps zmm24, zmm0
        vmovaps zmm25, zmm0
        vmovaps zmm26, zmm0
        vmovaps zmm27, zmm0
        vmovaps zmm28, zmm0
        vmovaps zmm29, zmm0
        vmovaps zmm30, zmm0
        vmovaps zmm31, zmm0
        mov     eax, r10d               ; bytes of x_t to go
.col:
        call    rcx                     ; zmm4-6: rows a-c's next 16 weights
        lea     r9, [rsi+r10*4]         ; token 4's x
        vmovups zmm7, [rsi]
        vfmadd231ps zmm0, zmm4, zmm7
        vfmadd231ps zmm8, zmm5, zmm7
        vfmadd231ps zmm12, zmm6, zmm7
        vmovups zmm7, [rsi+r10]
        vfmadd231ps zmm1, zmm4, zmm7
        vfmadd231ps zmm9, zmm5, zmm7
        vfmadd231ps zmm13, zmm6, zmm7
        vmovups zmm7, [rsi+r10*2]
        vfmadd231ps zmm2, zmm4, zmm7
        vfmadd231ps zmm10, zmm5, zmm7
        vfmadd231ps zmm14, zmm6, zmm7
        vmovups zmm7, [rsi+r12]
        vfmadd231ps zmm3, zmm4, zmm7
        vfmadd231ps zmm11, zmm5, zmm7
        vfmadd231ps zmm15, zmm6, zmm7
        vmovups zmm7, [r9]
        vfmadd231ps zmm16, zmm4, zmm7
        vfmadd231ps zmm24, zmm5, zmm7
        vfmadd231ps zmm28, zmm6, zmm7
        vmovups zmm7, [r9+r10]
        vfmadd231ps zmm17, zmm4, zmm7
        vfmadd231ps zmm25, zmm5, zmm7
        vfmadd231ps zmm29, zmm6, zmm7
        vmovups zmm7, [r9+r10*2]
        vfmadd231ps zmm18, zmm4, zmm7
        vfmadd231ps zmm26, zmm5, zmm7
        vfmadd231ps zmm30, zmm6, zmm7
        vmovups zmm7, [r9+r12]
        vfmadd231ps zmm19, zmm4, zmm7
        vfmadd231ps zmm27, zmm5, zmm7
        vfmadd231ps zmm31, zmm6, zmm7
        add     rsi, 64
        sub     eax, 64
        jnz     .col
        sub     rsi, r10                ; x again
        add     rdx, rbp                ; past rows b, c
        push    TILE8_ROWS
        pop     rbx                     ; rows to sum (rbx, rbp: free until .tri)
.row:                                   ; a row's eight results, in the fast kernels' order
        call    .half                   ; tokens 0-3 at rdi + t ostride; rdi 4 bytes on
        imul    r9, [rsp+24], FAST_TOKENS ; tokens 4-7: FAST_TOKENS ostride on
        lea     rdi, [rdi+r9-4]
        vmovaps zmm0, zmm16
        vmovaps zmm1, zmm17
        vmovaps zmm2, zmm18
        vmovaps zmm3, zmm19
        call    .half                   ; tokens 4-7
        sub     rdi, r9
        vmovaps zmm0, zmm8              ; the next row's accumulators into zmm0-3, zmm16-19
        vmovaps zmm1, zmm9
        vmovaps zmm2, zmm10
        vmovaps zmm3, zmm11
        vmovaps zmm8, zmm12
        vmovaps zmm9, zmm13
        vmovaps zmm10, zmm14
        vmovaps zmm11, zmm15
        vmovaps zmm16, zmm24
        vmovaps zmm17, zmm25
        vmovaps zmm18, zmm26
        vmovaps zmm19, zmm27
        vmovaps zmm24, zmm28
        vmovaps zmm25, zmm29
        vmovaps zmm26, zmm30
        vmovaps zmm27, zmm31
        dec     r8d
        jz      .done
        dec     ebx
        jnz     .row
        jmp     .tri
.done:
        add     rsp, 32                 ; the frame
        pop     r12
        pop     rbp
        pop     rbx
        vzeroupper
        ret
.half:                                  ; four tokens' sums from zmm0-3
        vextractf64x4 ymm4, zmm0, 1     ; chain 1 (lanes 8-15) as fast.asm's ymm 4+t
        vextractf64x4 ymm5, zmm1, 1
        vextractf64x4 ymm6, zmm2, 1
        vextractf64x4 ymm7, zmm3, 1
        jmp     matmul_f16_avx2.sum_row

; f16_rows3: tile8's loader for FP16 rows: zmm4-6 = 16 halves of rows a-c, exact.
;   in: rdx row a, rbx, rbp rows b, c bytes on   out: rdx 32 bytes on
f16_rows3:
        vcvtph2ps zmm4, [rdx]
        vcvtph2ps zmm5, [rdx+rbx]
        vcvtph2ps zmm6, [rdx+rbp]
        add     rdx, 32
        ret

; q8_rows3: tile8's loader for Q8_0 rows: zmm4-6 = the next 16 weights d q of rows a-c,
; exact; at a block's first 16 (eax, bytes of x_t to go, 0 mod 128) each row's d, in zmm20-22.
;   in: rdx row a, rbx, rbp rows b, c bytes on, eax   out: rdx past them
;   clobbers: ymm7 (free at tile8's calls)
q8_rows3:
        test    al, 64
        jnz     .half
        vpbroadcastw ymm7, [rdx]
        vcvtph2ps zmm20, ymm7
        vpbroadcastw ymm7, [rdx+rbx]
        vcvtph2ps zmm21, ymm7
        vpbroadcastw ymm7, [rdx+rbp]
        vcvtph2ps zmm22, ymm7
        add     rdx, 2
.half:
        vpmovsxbd zmm4, [rdx]
        vpmovsxbd zmm5, [rdx+rbx]
        vpmovsxbd zmm6, [rdx+rbp]
        vcvtdq2ps zmm4, zmm4
        vcvtdq2ps zmm5, zmm5
        vcvtdq2ps zmm6, zmm6
        vmulps  zmm4, zmm4, zmm20       ; d q: exact
        vmulps  zmm5, zmm5, zmm21
        vmulps  zmm6, zmm6, zmm22
        add     rdx, 16
        ret
