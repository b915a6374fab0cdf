; fast.asm: the fast instruction-set levels of the hot kernel, chosen at start-up by cpu.asm:
; AVX + FMA + F16C (VEX encoded), and AVX-512F on top for prompt blocks (EVEX). Never executed
; on a CPU without them and the OS saving their register state.

; matmul_f16_avx2: matmul_f16's product (kernels.asm) for k tokens at once, with fused
; multiply-adds, for n a multiple of 16: xout_t (d,) = W (d,n) f16 @ x_t (n,) for t < k,
; x_t = x + 4nt bytes, xout_t = xout + t ostride bytes; r9d != 0 adds to xout_t.
; One row at a time, by up to four tokens, in two chains each (8 ymm accumulators): each
; 16 halves of the row are converted once and multiplied by the same 16 columns of every
; token (a computed jump enters the unrolled tokens at k), so a block of prompt tokens costs
; its weights' conversions once per 4 tokens, and decode (k = 1) still has two independent
; chains. Rows go one after another: a single stream from memory per thread (two or four
; concurrent row streams measured 15-40% slower on decode).
; The float32 arithmetic of one (row, token) never depends on k or on the row split: lane i
; of chain c sums the columns j = 16m + 8c + i, m = 0, 1, ..., by one fused multiply-add each
; (rounded once); then l_i = c0_i + c1_i, then
; ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then + xout. So every prompt block and
; thread count gives the same bits; they differ from the baseline's (each product rounded
; before its add) by a few ulp of the sum.
; matmul_q8_avx2: the same with W in Q8_0 blocks (kernels.asm: matmul_q8), n a multiple of
; 32: each 16 weights d q (exact in float32) go through the very same fused multiply-adds, so
; its results are matmul_f16_avx2's on those weights, bit for bit.
; The weights are prefetched 8 KB ahead (4 and 16 KB measured no better); without it decode
; runs ~25% slower, with the model in 4 KB or in 2 MB pages.
;   in: rdi xout, rsi x, rdx W (rows of n halves, contiguous), ecx n (16, 32, ...), r8d d,
;   r9d accumulate; stack: k (1..4, low dword), ostride (a qword)
;   out: xout_t   clobbers: rax rcx rdx rdi rsi r8-r11 xmm0-xmm15 (upper halves cleared)
FAST_TOKENS = 4                         ; tokens per call at most (cpu.asm: job_tokens)
TOKEN_CODE = 13         ; bytes of each of .t3, .t2, .t1 (one token; k = 2..4 tests catch a change)
PREFETCH_AHEAD = 8192

matmul_q8_avx2:
        lea     rax, [matmul_f16_avx2.q8]
        jmp     matmul_f16_avx2.go
matmul_f16_avx2:
        lea     rax, [.f16]             ; where 16 weights are loaded (matmul_q8_avx2: .q8)
.go:
        push    r9                      ; [rsp]: accumulate; k at [rsp+16], ostride [rsp+24]
        imul    r10d, ecx, 4            ; s: bytes of an x_t
        xchg    rax, rcx                ; rcx: the loader (kept to the end)
        lea     r11, [r10+r10*2]        ; 3s
        imul    eax, [rsp+16], TOKEN_CODE
        lea     r9, [.t0+TOKEN_CODE]
        sub     r9, rax                 ; where the unrolled tokens are entered
.row:
        vzeroall                        ; ymm0-3: tokens 0-3, even groups; ymm4-7: odd
        mov     eax, r10d               ; bytes of x_t to go
        jmp     .top
.t3:
        vfmadd231ps ymm3, ymm8, [rsi+r11]
        vfmadd231ps ymm7, ymm9, [rsi+r11+32]
.t2:
        vfmadd231ps ymm2, ymm8, [rsi+r10*2]
        vfmadd231ps ymm6, ymm9, [rsi+r10*2+32]
.t1:
        vfmadd231ps ymm1, ymm8, [rsi+r10]
        vfmadd231ps ymm5, ymm9, [rsi+r10+32]
.t0:
        vfmadd231ps ymm0, ymm8, [rsi]
        vfmadd231ps ymm4, ymm9, [rsi+32]
        add     rsi, 64
        prefetcht0 [rdx+PREFETCH_AHEAD]
.top:
        sub     eax, 64
        jb      .sum
        jmp     rcx
.f16:                                   ; ymm8, ymm9: the next 16 FP16 weights
        vcvtph2ps ymm8, [rdx]           ; exact
        vcvtph2ps ymm9, [rdx+16]
        add     rdx, 32
        jmp     r9
.q8:                                    ; the same from Q8_0 blocks (n a multiple of 32)
        test    al, 64                  ; a block's first 16 (eax = s - 64 mod 128): its d
        jz      .half
        vpbroadcastw xmm10, [rdx]
        vcvtph2ps ymm10, xmm10          ; d in every lane, exact
        add     rdx, 2
.half:
        vpmovsxbd ymm8, [rdx]
        vpmovsxbd ymm9, [rdx+8]
        add     rdx, 16
        vcvtdq2ps ymm8, ymm8
        vcvtdq2ps ymm9, ymm9
        vmulps  ymm8, ymm8, ymm10       ; d q: exact (11 by 8 significant bits)
        vmulps  ymm9, ymm9, ymm10
        jmp     r9
.sum:
        sub     rsi, r10                ; x again
        call    .finish
        dec     r8d
        jnz     .row
        vzeroupper
        pop     r9
        ret
; .finish: one row's results for its k tokens from its chains (token t's chain 0 in ymm t,
; chain 1 in ymm 4+t), stored (or added) at rdi + t ostride; rdi moves to the next row's.
;   in: [rsp+8] accumulate, [rsp+24] k, [rsp+32] ostride (the callers' frames)
;   clobbers: rax xmm0-xmm3 (upper halves)
.finish:
        push    rcx
        vaddps  ymm0, ymm0, ymm4        ; l: per token, both chains
        vaddps  ymm1, ymm1, ymm5
        vaddps  ymm2, ymm2, ymm6
        vaddps  ymm3, ymm3, ymm7
        vhaddps ymm0, ymm0, ymm1
        vhaddps ymm2, ymm2, ymm3
        vhaddps ymm0, ymm0, ymm2        ; tokens 0-3: lanes 0-3 summed, then lanes 4-7
        vextractf128 xmm1, ymm0, 1
        vaddps  xmm0, xmm0, xmm1        ; the row's sums for tokens 0-3
        mov     rcx, rdi
        mov     eax, [rsp+32]           ; k
.put:
        cmp     dword [rsp+16], 0
        je      .store
        vaddss  xmm0, xmm0, [rcx]
.store:
        vmovss  [rcx], xmm0
        vpermilps xmm0, xmm0, 0x39      ; the next token's sum to lane 0
        add     rcx, [rsp+40]
        dec     eax
        jnz     .put
        add     rdi, 4
        pop     rcx
        ret

; matmul_f16_avx512: matmul_f16_avx2's product, bit for bit, four rows at a time when k = 4
; (prompt blocks), with AVX-512F. One zmm accumulator per (row, token) holds both chains of
; matmul_f16_avx2 (lanes 0-7 chain 0, lanes 8-15 chain 1: 16 halves converted at once, the
; same fused multiply-adds lane by lane), and each load of 16 x columns serves four rows: 16
; accumulators, 4 conversions and 4 x loads per 16 FMAs of 16 lanes (measured in a C harness
; on the 2b shapes, 2 threads: 1.45x the two-row version, 2.5x the AVX2 kernel). The sums go
; through matmul_f16_avx2's .finish a row at a time, the next row's accumulators moved into
; zmm0-3. k < 4 (decode: one row stream reads memory faster) and the last d mod 4 rows go to
; matmul_f16_avx2. Addresses carry no displacement (the builder refuses them in EVEX code:
; keystone mis-encodes them).
;   in, out, clobbers: as matmul_f16_avx2 (zmm0-zmm24 too)
matmul_f16_avx512:
        cmp     dword [rsp+8], FAST_TOKENS
        jb      matmul_f16_avx2
        push    r9                      ; [rsp]: accumulate; k at [rsp+16], ostride [rsp+24]
        imul    r10d, ecx, 4            ; s: bytes of an x_t
        lea     r9d, [rcx+rcx]          ; 2n: the next row's offset
        lea     ecx, [r9+r9*2]          ; 6n: row d's
.quad:
        cmp     r8d, 4
        jb      .last
        lea     r11, [r10+r10*2]        ; 3s
        vzeroall                        ; zmm0-3: row a, tokens 0-3; zmm8-11 b; zmm12-15 c
        vmovaps zmm16, zmm0             ; zmm16-19: row d
        vmovaps zmm17, zmm0
        vmovaps zmm18, zmm0
        vmovaps zmm19, zmm0
        mov     eax, r10d               ; bytes of x_t to go
.col:
        prefetcht0 [rdx+PREFETCH_AHEAD]
        vcvtph2ps zmm20, [rdx]          ; row a's 16 halves, exact
        vcvtph2ps zmm21, [rdx+r9]       ; row b's
        vcvtph2ps zmm22, [rdx+r9*2]     ; row c's
        vcvtph2ps zmm23, [rdx+rcx]      ; row d's
        add     rdx, 32
        vmovups zmm24, [rsi]
        vfmadd231ps zmm0, zmm20, zmm24
        vfmadd231ps zmm8, zmm21, zmm24
        vfmadd231ps zmm12, zmm22, zmm24
        vfmadd231ps zmm16, zmm23, zmm24
        vmovups zmm24, [rsi+r10]
        vfmadd231ps zmm1, zmm20, zmm24
        vfmadd231ps zmm9, zmm21, zmm24
        vfmadd231ps zmm13, zmm22, zmm24
        vfmadd231ps zmm17, zmm23, zmm24
        vmovups zmm24, [rsi+r10*2]
        vfmadd231ps zmm2, zmm20, zmm24
        vfmadd231ps zmm10, zmm21, zmm24
        vfmadd231ps zmm14, zmm22, zmm24
        vfmadd231ps zmm18, zmm23, zmm24
        vmovups zmm24, [rsi+r11]
        vfmadd231ps zmm3, zmm20, zmm24
        vfmadd231ps zmm11, zmm21, zmm24
        vfmadd231ps zmm15, zmm22, zmm24
        vfmadd231ps zmm19, zmm23, zmm24
        add     rsi, 64
        sub     eax, 64
        jnz     .col
        sub     rsi, r10                ; x again
        add     rdx, rcx                ; past row d
        mov     r11d, 4                 ; rows to finish
.row:
        vextractf64x4 ymm4, zmm0, 1     ; chain 1 of each token
        vextractf64x4 ymm5, zmm1, 1
        vextractf64x4 ymm6, zmm2, 1
        vextractf64x4 ymm7, zmm3, 1
        call    matmul_f16_avx2.finish
        vmovaps zmm0, zmm8              ; the next row's accumulators in row a's place
        vmovaps zmm1, zmm9
        vmovaps zmm2, zmm10
        vmovaps zmm3, zmm11
        vmovaps zmm8, zmm12
        vmovaps zmm9, zmm13
        vmovaps zmm10, zmm14
        vmovaps zmm11, zmm15
        vmovaps zmm12, zmm16
        vmovaps zmm13, zmm17
        vmovaps zmm14, zmm18
        vmovaps zmm15, zmm19
        dec     r8d
        dec     r11d
        jnz     .row
        jmp     .quad
.last:
        pop     r9
        shr     r10d, 2
        mov     ecx, r10d               ; n
        test    r8d, r8d
        jnz     matmul_f16_avx2         ; the rows left: 1 to 3
        vzeroupper
        ret
