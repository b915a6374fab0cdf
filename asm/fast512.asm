; fast512.asm: the AVX-512F level of the hot kernels, chosen by cpu.asm where the CPU and the
; OS have AVX-512F (and --avx2 does not ask for the AVX2 level). Their results are fast.asm's,
; bit for bit: one zmm accumulator per (row, token) holds matmul_f16_avx2's two chains (lanes
; 0-7 chain 0, lanes 8-15 chain 1), so 16 consecutive weights are converted at once and every
; lane gets the same fused multiply-adds in the same order; the sums go through the same
; tree. Addresses carry no displacement (keystone mis-encodes EVEX displacements; the builder
; refuses them).

; matmul_f16_avx512: matmul_f16_avx2's product (fast.asm). Prompt blocks (k = 4): four rows at
; a time (tile4): each load of 16 x columns serves four rows and each converted weight four
; tokens, 16 accumulators. Other k, and the last d mod 4 rows: matmul_f16_avx2 (decode, k = 1,
; streams no faster in zmm registers: measured on an AVX-512 host, 2026-12-03).
; matmul_q8_avx512: matmul_q8_avx2's product: the same with the weights from Q8_0 blocks
; (d q, exact); decode reads rows i and i + d/2 together as matmul_q8_avx2 does, 16 weights a
; step (q8_pairs: 1.13x matmul_q8_avx2's decode there).
;   in: rdi xout, rsi x, rdx W, ecx n (16, 32, ...; Q8_0: 32, 64, ...), r8d d, r9d accumulate;
;   stack: k (1..4, low dword), ostride (a qword)   out: xout_t
;   clobbers: rax rcx rdx rdi rsi r8-r11 xmm0-xmm15 (the zmm registers; upper halves cleared)
matmul_q8_avx512:
        lea     rax, [q8_rows4]
        lea     r11, [matmul_q8_avx2]
        imul    r10d, ecx, Q8_0_BLOCK
        shr     r10d, 5                 ; bytes of a row: n/32 blocks
        cmp     dword [rsp+8], 1        ; k
        jne     tile4
        test    r8b, 1
        jnz     matmul_q8_avx2          ; decode, d odd
        jmp     q8_pairs
matmul_f16_avx512:
        lea     rax, [f16_rows4]
        lea     r11, [matmul_f16_avx2]
        lea     r10d, [rcx+rcx]         ; bytes of a row
        jmp     tile4
; zmm0_put: the sum of zmm0's lanes in the fast kernels' order (l_i = lane i + lane i + 8,
; then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))) stored at rdi, or added to it
; when r9d is not 0.
;   in: zmm0, rdi, r9d   out: [rdi]   clobbers: zmm0 zmm1
zmm0_put:
        vextractf64x4 ymm1, zmm0, 1
        vaddps  ymm0, ymm0, ymm1        ; l
        vextractf128 xmm1, ymm0, 1
        vhaddps xmm0, xmm0, xmm1        ; l0 + l1, l2 + l3, l4 + l5, l6 + l7
        vhaddps xmm0, xmm0, xmm0
        vpermilps xmm1, xmm0, 1
        vaddss  xmm0, xmm0, xmm1
        test    r9d, r9d
        jz      .store
        vaddss  xmm0, xmm0, [rdi]
.store:
        vmovss  [rdi], xmm0
        ret

; q8_pairs: matmul_q8_avx512 for k = 1, d even: rows i and i + d/2 (i < d/2) in one pass, each
; row's 16 weights a step: d q in zmm8 / zmm9, the two accumulators zmm0 / zmm2.
q8_pairs:
        shr     r8d, 1                  ; pairs
        imul    r11d, ecx, Q8_0_BLOCK / 2
        shr     r11d, 4                 ; bytes of a row (n/32 blocks)
        imul    r11, r8                 ; row i + d/2 is r11 bytes on
        push    rbx
        imul    ebx, r8d, 4             ; its output: rbx bytes on
.pair:
        vpxord  zmm0, zmm0, zmm0
        vpxord  zmm2, zmm2, zmm2
        mov     eax, ecx                ; weights to go
        mov     r10, rsi
.block:
        test    al, 16
        jnz     .half                   ; a block's second 16
        vpbroadcastw ymm10, [rdx]
        vcvtph2ps zmm10, ymm10          ; row i's d in every lane, exact
        vpbroadcastw ymm11, [rdx+r11]
        vcvtph2ps zmm11, ymm11          ; row i + d/2's
        prefetcht0 [rdx+PREFETCH_AHEAD]
        prefetcht0 [rdx+r11+PREFETCH_AHEAD]
        add     rdx, 2
.half:
        vpmovsxbd zmm8, [rdx]
        vcvtdq2ps zmm8, zmm8
        vmulps  zmm8, zmm8, zmm10       ; d q: exact (11 by 8 significant bits)
        vfmadd231ps zmm0, zmm8, [r10]
        vpmovsxbd zmm9, [rdx+r11]
        vcvtdq2ps zmm9, zmm9
        vmulps  zmm9, zmm9, zmm11
        vfmadd231ps zmm2, zmm9, [r10]
        add     rdx, 16
        add     r10, 64
        sub     eax, 16
        jnz     .block
        call    zmm0_put                ; row i's
        vmovaps zmm0, zmm2
        add     rdi, rbx
        call    zmm0_put                ; row i + d/2's
        sub     rdi, rbx
        add     rdi, 4
        dec     r8d
        jnz     .pair
        pop     rbx
        vzeroupper
        ret

; tile4: matmul_f16_avx512's and matmul_q8_avx512's prompt blocks (k = 4): four rows a-d at a
; time; the loader (r12) puts each row's next 16 weights in zmm20-23 and walks row a (rows b,
; c, d are rbx, 2 rbx and rbp bytes on); 16 accumulators: row a's tokens 0-3 in zmm0-3, b's in
; zmm8-11, c's in zmm12-15, d's in zmm16-19. Then each row's sums: the upper halves (chain 1)
; into ymm4-7 and matmul_f16_avx2.sum_row (fast.asm: its order, its stores), the next row's
; accumulators moved into zmm0-3. k != 4 and the last d mod 4 rows: the AVX2 kernel (r11).
;   in: as matmul_f16_avx512, and rax the loader, r10 bytes of a row of W, r11 the AVX2 kernel
;   out, clobbers: as matmul_f16_avx512
tile4:
        cmp     dword [rsp+8], FAST_TOKENS
        jne     .avx2_now
        push    rbx
        push    rbp
        push    r12
        push    r14
        push    rax                     ; (rsp 0 mod 16 at the calls)
        mov     r12, rax
        mov     r14, r11
        mov     rbx, r10
        push    qword [rsp+56]          ; ostride, k, a slot and accumulate: the frame
        push    qword [rsp+56]          ; matmul_f16_avx2.sum_row reads (its .go's: k at
        push    rax                     ; [rsp+16], ostride at [rsp+24])
        push    r9
        imul    r10d, ecx, 4            ; s: bytes of an x_t
        lea     r11, [r10+r10*2]        ; 3s
.quad:
        cmp     r8d, 4
        jb      .rest
        lea     rbp, [rbx+rbx*2]        ; row d: 3 rows on
        vzeroall                        ; rows a-c's accumulators, zmm0-15
        vmovaps zmm16, zmm0             ; row d's
        vmovaps zmm17, zmm0
        vmovaps zmm18, zmm0
        vmovaps zmm19, zmm0
        mov     eax, r10d               ; bytes of x_t to go
.col:
        call    r12                     ; zmm20-23: rows a-d's next 16 weights
        vmovups zmm24, [rsi]            ; token 0's 16 columns
        vfmadd231ps zmm0, zmm20, zmm24
        vfmadd231ps zmm8, zmm21, zmm24
        vfmadd231ps zmm12, zmm22, zmm24
        vfmadd231ps zmm16, zmm23, zmm24
        vmovups zmm24, [rsi+r10]        ; token 1's
        vfmadd231ps zmm1, zmm20, zmm24
        vfmadd231ps zmm9, zmm21, zmm24
        vfmadd231ps zmm13, zmm22, zmm24
        vfmadd231ps zmm17, zmm23, zmm24
        vmovups zmm24, [rsi+r10*2]      ; token 2's
        vfmadd231ps zmm2, zmm20, zmm24
        vfmadd231ps zmm10, zmm21, zmm24
        vfmadd231ps zmm14, zmm22, zmm24
        vfmadd231ps zmm18, zmm23, zmm24
        vmovups zmm24, [rsi+r11]        ; token 3's
        vfmadd231ps zmm3, zmm20, zmm24
        vfmadd231ps zmm11, zmm21, zmm24
        vfmadd231ps zmm15, zmm22, zmm24
        vfmadd231ps zmm19, zmm23, zmm24
        add     rsi, 64
        sub     eax, 64
        jnz     .col
        sub     rsi, r10                ; x again
        add     rdx, rbp                ; past rows b-d
        mov     ebp, 4                  ; rows to sum
.row:                                   ; a row's four results, in the fast kernels' order
        vextractf64x4 ymm4, zmm0, 1     ; chain 1 (lanes 8-15) as fast.asm's ymm 4+t
        vextractf64x4 ymm5, zmm1, 1
        vextractf64x4 ymm6, zmm2, 1
        vextractf64x4 ymm7, zmm3, 1
        call    matmul_f16_avx2.sum_row ; stored at rdi + t ostride; rdi 4 bytes on
        vmovaps zmm0, zmm8              ; the next row's accumulators into zmm0-3
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
        dec     ebp
        jnz     .row
        jmp     .quad
.rest:
        mov     rax, r14
        mov     ecx, r10d
        shr     ecx, 2                  ; n
        add     rsp, 40                 ; the frame
        pop     r14
        pop     r12
        pop     rbp
        pop     rbx
        test    r8d, r8d
        jnz     .avx2                   ; the last 1-3 rows
        vzeroupper
        ret
.avx2_now:
        mov     rax, r11
.avx2:
        jmp     rax

; f16_rows4: tile4's loader for FP16 rows: zmm20-23 = 16 halves of rows a-d, exact.
;   in: rdx row a, rbx bytes of a row, rbp 3 rows   out: rdx 32 bytes on
f16_rows4:
        vcvtph2ps zmm20, [rdx]
        vcvtph2ps zmm21, [rdx+rbx]
        vcvtph2ps zmm22, [rdx+rbx*2]
        vcvtph2ps zmm23, [rdx+rbp]
        add     rdx, 32
        ret

; q8_rows4: tile4's loader for Q8_0 rows: zmm20-23 = the next 16 weights d q of rows a-d,
; exact; at a block's first 16 (eax, bytes of x_t to go, 0 mod 128) each row's d, in zmm25-28.
;   in: rdx row a, rbx bytes of a row, rbp 3 rows, eax   out: rdx past them
;   clobbers: ymm4 (free in tile4's loop)
q8_rows4:
        test    al, 64
        jnz     .half
        vpbroadcastw ymm4, [rdx]
        vcvtph2ps zmm25, ymm4
        vpbroadcastw ymm4, [rdx+rbx]
        vcvtph2ps zmm26, ymm4
        vpbroadcastw ymm4, [rdx+rbx*2]
        vcvtph2ps zmm27, ymm4
        vpbroadcastw ymm4, [rdx+rbp]
        vcvtph2ps zmm28, ymm4
        add     rdx, 2
.half:
        vpmovsxbd zmm20, [rdx]
        vpmovsxbd zmm21, [rdx+rbx]
        vpmovsxbd zmm22, [rdx+rbx*2]
        vpmovsxbd zmm23, [rdx+rbp]
        vcvtdq2ps zmm20, zmm20
        vcvtdq2ps zmm21, zmm21
        vcvtdq2ps zmm22, zmm22
        vcvtdq2ps zmm23, zmm23
        vmulps  zmm20, zmm20, zmm25     ; d q: exact
        vmulps  zmm21, zmm21, zmm26
        vmulps  zmm22, zmm22, zmm27
        vmulps  zmm23, zmm23, zmm28
        add     rdx, 16
        ret
