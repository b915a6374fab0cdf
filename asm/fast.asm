; fast.asm: the fast instruction-set level of the hot kernel, chosen at start-up by cpu.asm:
; AVX + FMA + F16C (VEX encoded). Never executed on a CPU without them and the OS saving their
; register state.

; matmul_f16_avx2: matmul_f16's product (kernels.asm) for k tokens at once, with fused
; multiply-adds, for n a multiple of 16: xout_t (d,) = W (d,n) f16 @ x_t (n,) for t < k,
; x_t = x + 4nt bytes, xout_t = xout + t ostride bytes; r9d != 0 adds to xout_t.
; One row at a time, by up to four tokens, in two chains each (8 ymm accumulators): each
; 16 halves of the row are converted once and multiplied by the same 16 columns of every
; token (a computed jump enters the unrolled tokens at k), so a block of prompt tokens costs
; its weights' conversions once per 4 tokens. FP16 with k = 3 and d even (the prompt's calls,
; cpu.asm): two rows at once (.tile, 12 accumulators), each load of 8 x columns serving
; both rows: 10 loads per 12 fused multiply-adds instead of 15. In a C harness of the call
; pattern (in cache, 16 rows x 63 tokens): 1.80 fused multiply-adds a cycle against 1.86 for
; the one-row pass at n = 640, 1.78 against 1.59 at 2,048, 1.68 against 1.06 at 16,384; in
; the engine 2b FP16 prompt 1.16x (2 threads and 1), real 270M 0.99x (AVX2 host).
; The float32 arithmetic of one (row, token) never depends on k or on the row split: lane i
; of chain c sums the columns j = 16m + 8c + i, m = 0, 1, ..., by one fused multiply-add each
; (rounded once); then l_i = c0_i + c1_i, then
; ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then + xout. So every prompt block and
; thread count gives the same bits; they differ from the baseline's (each product rounded
; before its add) by a few ulp of the sum.
; matmul_q8_avx2: the same with W in Q8_0 blocks (kernels.asm: matmul_q8), n a multiple of
; 32: each 16 weights d q (exact in float32) go through the very same fused multiply-adds, so
; its results are matmul_f16_avx2's on those weights, bit for bit.
; Decode (k = 1) reads several rows at once by a straight loop, each row's chains and order
; unchanged (its sums those of k = 2 or 4): FP16 with d a multiple of 4 rows i, i + d/4,
; i + d/2, i + 3d/4 (.quad), Q8_0 with d even rows i and i + d/2 (.pair); other d one row at a
; time. mm_share gives a thread its whole share of rows in one call, so it streams from 4 (2)
; places megabytes apart. Against one row at a time on the 2b shapes: Q8_0 12-20% faster; FP16
; two rows 25%, four rows 1.08x two on 2 threads and 1.20x on 1 (AVX2 host; rows 8 apart,
; within a 16-row chunk, gained nothing).
; Decode prefetches the rows it streams PREFETCH_AHEAD bytes ahead: Q8_0 pairs at each
; block's scale (without it Q8_0 decode ran ~25% slower, AVX2 host, 8 KB ahead; 2 KB as fast
; on the AVX-512 host, 1.02-1.03x), FP16's four rows every other pass (a line of each):
; 1.08-1.14x on 2b FP16 and Gemma 3 270M decode, 1 and 2 threads (AVX-512 Intel host; 8 KB
; ahead only 1.02-1.05x, two of the four rows 1.01-1.05x); the AVX2-only EPYC measured an
; 8 KB prefetch on FP16 pairs at 0.94-1.17x, and has not run this one. The one-row passes
; (k = 1..4: short prompts, a block's last tokens, AVX2 Q8_0 prompts) prefetch their row as
; well, FP16 every 16 weights, Q8_0 at each block: a short prompt's calls read the weights
; from memory one row at a time (2b FP16 1.21x, Q8_0 1.90x on a 2-token prompt, 1.29x and
; 1.49x on 6 tokens, 2 threads; 64-token prompts unchanged, --avx2 Q8_0 1.04x; AVX-512
; Intel host). FP16's two-row prompt tiles do not: their weights come from the cache after a
; chunk's first call, and prefetching them into L1 evicted the tokens' x (without: 2b FP16
; prompt 1.11-1.20x on 2 threads, 1.05x on 1; Q8_0 and the real 270M unchanged; AVX2 host).
; matmul_f16_avx512: the same kernel on the AVX-512F level, where k = 8 goes to fast512.asm's
; tile8 (3 x 8 tiles, the same bits; other k run here). It enters a nop early: an address of
; its own, which cpu.asm's choice and its tests tell apart from the AVX2 level's.
; matmul_q8_avx512: matmul_q8_avx2's entry likewise.
;   in: rdi xout, rsi x, rdx W (rows of n halves, contiguous), ecx n (16, 32, ...), r8d d,
;   r9d accumulate; stack: k (1..4, or 8 with AVX-512F; low dword), ostride (a qword)
;   out: xout_t   clobbers: rax rcx rdx rdi rsi r8-r11 xmm0-xmm15 (upper halves cleared;
;   k = 8: the zmm registers)
FAST_TOKENS = 4                         ; tokens per call at most (cpu.asm; AVX-512: TILE8_TOKENS)
TILE8_TOKENS = 2 * FAST_TOKENS          ; the AVX-512 kernels' (fast512.asm; cpu.asm)
TILE_TOKENS = FAST_TOKENS - 1           ; FP16's on AVX2: its two-row tiles (.tile; cpu.asm)
TOKEN_CODE = 13         ; bytes of each of .t3, .t2, .t1 (one token; k = 2..4 tests catch a change)
PREFETCH_AHEAD = 2048

matmul_q8_avx512:
        nop                             ; (AVX-512F: tile8 at k = 8)
matmul_q8_avx2:
        lea     rax, [matmul_f16_avx2.q8]
        imul    r11d, ecx, Q8_0_BLOCK / 2
        shr     r11d, 4                 ; bytes of a row (n/32 blocks)
        cmp     dword [rsp+8], 1        ; k
        jne     matmul_f16_avx2.go
        test    r8b, 1
        jnz     matmul_f16_avx2.go      ; decode, d odd: one row at a time
        shr     r8d, 1                  ; decode, d even: d/2 pairs, row i with row i + d/2
        imul    r11, r8
        push    r11                     ; the second rows' weights, bytes on (.pair)
        imul    eax, r8d, 4
        push    rax                     ; ostride: the second rows' outputs, bytes on
        push    2                       ; k: .sum stores the pair's two sums
        lea     rax, [matmul_f16_avx2.pair]
        jmp     matmul_f16_avx2.rows_apart
matmul_f16_avx512:
        nop                             ; (AVX-512F: tile8 at k = 8)
matmul_f16_avx2:
        lea     rax, [.f16]             ; where 16 weights are loaded (matmul_q8_avx2: .q8)
        lea     r11d, [rcx+rcx]         ; bytes of a row
        cmp     dword [rsp+8], TILE_TOKENS ; k
        jne     .k
        test    r8b, 1
        jnz     .go                     ; k = 3, d odd: one row at a time
        lea     rax, [.tile]            ; k = 3, d even: rows in pairs
        jmp     .go
.k:
        cmp     dword [rsp+8], 1
        jne     .go
        test    r8b, 3
        jnz     .go                     ; decode, d not a multiple of 4: one row at a time
        shr     r8d, 2                  ; decode: d/4 passes, rows i + j d/4 for j < 4
        imul    r11, r8
        push    r11                     ; the next row's weights, bytes on (.quad)
        imul    eax, r8d, 4
        push    rax                     ; ostride: the next row's outputs, bytes on
        push    4                       ; k: .sum stores the four sums
        lea     rax, [.quad]
.rows_apart:                            ; (the two entries' tails kept apart: shared, they
        call    .go                     ; packed 3 bytes larger)
        add     rsp, 24
        ret
.go:
        imul    r10d, ecx, 4            ; s: bytes of an x_t
        xchg    rax, rcx                ; rcx: the loader (kept to the end)
        cmp     dword [rsp+8], TILE8_TOKENS ; k
        je      tile8                   ; (AVX-512F: fast512.asm)
        push    r9                      ; [rsp]: accumulate; k at [rsp+16], ostride [rsp+24]
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
.top:
        sub     eax, 64
        jb      .sum
        jmp     rcx
.f16:                                   ; ymm8, ymm9: the next 16 FP16 weights
        prefetcht0 [rdx+PREFETCH_AHEAD] ; (twice a line: no test; see the header)
        vcvtph2ps ymm8, [rdx]           ; exact
        vcvtph2ps ymm9, [rdx+16]
        add     rdx, 32
        jmp     r9
.q8:                                    ; the same from Q8_0 blocks (n a multiple of 32)
        test    al, 64                  ; a block's first 16 (eax = s - 64 mod 128): its d
        jz      .half
        prefetcht0 [rdx+PREFETCH_AHEAD]
        vpbroadcastw xmm10, [rdx]
        vcvtph2ps ymm10, xmm10          ; d in every lane, exact
        add     rdx, 2
.half:
        vpmovsxbd ymm8, [rdx]
        vpmovsxbd ymm9, [rdx+8]
        vcvtdq2ps ymm8, ymm8
        vcvtdq2ps ymm9, ymm9
        vmulps  ymm8, ymm8, ymm10       ; d q: exact (11 by 8 significant bits)
        vmulps  ymm9, ymm9, ymm10
        add     rdx, 16
        jmp     r9
.quad:                                  ; FP16 decode, to the rows' end: 16 halves of rows
        mov     r9, [rsp+32]            ; i, i + q, i + 2q, i + 3q (q = d/4, r9 bytes a row
        lea     r11, [r9+r9*2]          ; on) a pass; row i + jq: chains ymm j, ymm 4+j
.q16:
        test    al, 64                  ; every other pass (a 64-byte line of each row):
        jz      .q16_load               ; the four rows' lines PREFETCH_AHEAD on
        prefetcht0 [rdx+PREFETCH_AHEAD]
        prefetcht0 [rdx+r9+PREFETCH_AHEAD]
        prefetcht0 [rdx+r9*2+PREFETCH_AHEAD]
        prefetcht0 [rdx+r11+PREFETCH_AHEAD]
.q16_load:
        vcvtph2ps ymm8, [rdx]
        vcvtph2ps ymm9, [rdx+16]
        vfmadd231ps ymm0, ymm8, [rsi]
        vfmadd231ps ymm4, ymm9, [rsi+32]
        vcvtph2ps ymm8, [rdx+r9]
        vcvtph2ps ymm9, [rdx+r9+16]
        vfmadd231ps ymm1, ymm8, [rsi]
        vfmadd231ps ymm5, ymm9, [rsi+32]
        vcvtph2ps ymm8, [rdx+r9*2]
        vcvtph2ps ymm9, [rdx+r9*2+16]
        vfmadd231ps ymm2, ymm8, [rsi]
        vfmadd231ps ymm6, ymm9, [rsi+32]
        vcvtph2ps ymm8, [rdx+r11]
        vcvtph2ps ymm9, [rdx+r11+16]
        vfmadd231ps ymm3, ymm8, [rsi]
        vfmadd231ps ymm7, ymm9, [rsi+32]
        add     rdx, 32
        add     rsi, 64
        sub     eax, 64
        jnb     .q16
        jmp     .sum
.pair:                                  ; decode pairs (matmul_q8_avx2), to the rows' end:
        mov     r9, [rsp+32]            ; row i + d/2 is r9 bytes on; 16 weights of each a
.pairs:                                 ; pass (row i: chains ymm0, ymm4; row i + d/2: ymm1,
        test    al, 64                  ; ymm5: the pair is k = 2) in .q8's registers (they
        jz      .pairhalf               ; pack smaller); .pairhalf: a block's second 16
        prefetcht0 [rdx+PREFETCH_AHEAD]
        vpbroadcastw xmm10, [rdx]
        vcvtph2ps ymm10, xmm10          ; row i's d (as .q8)
        prefetcht0 [rdx+r9+PREFETCH_AHEAD]
        vpbroadcastw xmm11, [rdx+r9]
        vcvtph2ps ymm11, xmm11          ; row i + d/2's d
        add     rdx, 2
.pairhalf:
        vpmovsxbd ymm8, [rdx]
        vpmovsxbd ymm9, [rdx+8]
        vcvtdq2ps ymm8, ymm8
        vcvtdq2ps ymm9, ymm9
        vmulps  ymm8, ymm8, ymm10
        vmulps  ymm9, ymm9, ymm10
        vfmadd231ps ymm0, ymm8, [rsi]
        vfmadd231ps ymm4, ymm9, [rsi+32]
        vpmovsxbd ymm8, [rdx+r9]
        vpmovsxbd ymm9, [rdx+r9+8]
        vcvtdq2ps ymm8, ymm8
        vcvtdq2ps ymm9, ymm9
        vmulps  ymm8, ymm8, ymm11
        vmulps  ymm9, ymm9, ymm11
        vfmadd231ps ymm1, ymm8, [rsi]
        vfmadd231ps ymm5, ymm9, [rsi+32]
        add     rdx, 16
        add     rsi, 64
        sub     eax, 64
        jnb     .pairs                  ; then .sum
.sum:                                   ; the row's results for its k tokens from its chains
        sub     rsi, r10                ; x again
        call    .sum_row
.next:
        dec     r8d
        jnz     .row
        vzeroupper
        pop     r9
        ret
; .sum_row: a row's results for its k tokens, from its chains (token t's chain 0 in ymm t,
; chain 1 in ymm 4+t), stored (or added) at rdi + t ostride; rdi then 4 bytes on. .sum_l:
; the same from l (both chains added) in ymm0-3. Called with the frame .go pushes (the
; accumulate flag, then the kernel's return address, k and ostride; fast512.asm's tile8 builds
; the same four qwords).
;   clobbers: rax xmm0-xmm3 (ymm)
.sum_row:
        vaddps  ymm0, ymm0, ymm4        ; l: per token, both chains
        vaddps  ymm1, ymm1, ymm5
        vaddps  ymm2, ymm2, ymm6
        vaddps  ymm3, ymm3, ymm7
.sum_l:                                 ; (from l in ymm0-3)
        push    rdi
        vhaddps ymm0, ymm0, ymm1
        vhaddps ymm2, ymm2, ymm3
        vhaddps ymm0, ymm0, ymm2        ; tokens 0-3: lanes 0-3 summed, then lanes 4-7
        vextractf128 xmm1, ymm0, 1
        vaddps  xmm0, xmm0, xmm1        ; the row's sums for tokens 0-3
        mov     eax, [rsp+32]           ; k
.put:
        cmp     dword [rsp+16], 0       ; accumulate
        je      .store
        vaddss  xmm0, xmm0, [rdi]
.store:
        vmovss  [rdi], xmm0
        vpermilps xmm0, xmm0, 0x39      ; the next token's sum to lane 0
        add     rdi, [rsp+40]           ; ostride
        dec     eax
        jnz     .put
        pop     rdi
        add     rdi, 4                  ; the next row's
        ret
.tile:                                  ; FP16, k = 3, d even: rows a and b = a + 1 at once
        mov     r11d, r10d              ; (.go's loader, entered once a pair, to its end) row
        shr     r11d, 1                 ; a's chains in ymm0-2 / ymm4-6 (as the one-row
.col3:                                  ; pass's), row b's in ymm10-12 / ymm13-15 (r11 = s/2:
                                        ; bytes of a row); their weights in ymm8 and ymm9 (as
                                        ; the loaders': it packs smaller); each x load (ymm7)
                                        ; serves both rows
        vcvtph2ps ymm8, [rdx]
        vcvtph2ps ymm9, [rdx+r11]
        vmovups ymm7, [rsi]
        vfmadd231ps ymm0, ymm8, ymm7
        vfmadd231ps ymm10, ymm9, ymm7
        vmovups ymm7, [rsi+r10]
        vfmadd231ps ymm1, ymm8, ymm7
        vfmadd231ps ymm11, ymm9, ymm7
        vmovups ymm7, [rsi+r10*2]
        vfmadd231ps ymm2, ymm8, ymm7
        vfmadd231ps ymm12, ymm9, ymm7
        vcvtph2ps ymm8, [rdx+16]
        vcvtph2ps ymm9, [rdx+r11+16]
        vmovups ymm7, [rsi+32]
        vfmadd231ps ymm4, ymm8, ymm7
        vfmadd231ps ymm13, ymm9, ymm7
        vmovups ymm7, [rsi+r10+32]
        vfmadd231ps ymm5, ymm8, ymm7
        vfmadd231ps ymm14, ymm9, ymm7
        vmovups ymm7, [rsi+r10*2+32]
        vfmadd231ps ymm6, ymm8, ymm7
        vfmadd231ps ymm15, ymm9, ymm7
        add     rdx, 32
        add     rsi, 64
        sub     eax, 64
        jnb     .col3
        sub     rsi, r10                ; x again
        add     rdx, r11                ; past row b
        call    .sum_row                ; row a (ymm3, 7: no token 3)
        dec     r8d                     ; (then .next counts row b)
        vaddps  ymm0, ymm10, ymm13      ; row b's l
        vaddps  ymm1, ymm11, ymm14
        vaddps  ymm2, ymm12, ymm15
        call    .sum_l                  ; row b
        jmp     .next
