; tokenizer.asm: the prompt's token ids (CONTRACTS.md "Tokenizer rules", the twin of
; builder/tokenizer.py step for step). A symbol is a run of the normalised text: a qword of
; (u32 start, u32 tag), tag = the id of a matched user-defined piece (never merged) or -1.
; Symbols are contiguous: symbol j ends where j+1 starts; a sentinel holds the text's end.

; tokenize: spaces -> U+2581; user-defined pieces (longest first) or one UTF-8 character per
; symbol; merge the adjacent free pair whose bytes are the best-scoring normal piece
; (leftmost on ties) until none is; each symbol -> its id, or one byte piece per byte.
;   in: rbx header, rbp front_base, opt_prompt   out: r12 -> ids (BOS first, room for
;   ctx_len), r13d = their count   clobbers: rax rcx rdx rsi rdi r8-r11 r14 r15 xmm0 xmm1
;   (fatal "prompt too long" for more ids than ctx_len, or early when the text alone proves
;   it: more bytes than ctx_len * max_piece_len)
tokenize:
        mov     rsi, [rbp+V_PROMPT]
        test    rsi, rsi
        jnz     .measure
        lea     rsi, [msg_newline+1]    ; no -p: the empty prompt
.measure:
        mov     rdi, rsi
        xor     eax, eax
        or      rcx, -1
        repne   scasb
        not     rcx                     ; length + 1
        push    rsi
        lea     r14, [rcx+rcx*2+4]
        mov     eax, [rbp+V_CTX_LEN]
        add     r14, rax                ; n3 >= 3 * length + 3 (text, 3 zero bytes) and ctx_len
        mov     rdi, r14
        shl     rdi, 4
        call    alloc                   ; text [n3 bytes] | ids [4 * n3] | ... | symbols [8 * n3]
        pop     rsi
        mov     r15, rax                ; text
        lea     r12, [rax+r14]          ; ids
        lea     r14, [rax+r14*8]        ; symbols
        mov     rdi, rax
.normalise:
        lodsb
        test    al, al
        jz      .normalised
        cmp     al, ' '
        jne     .copy
        mov     ax, 0x96E2              ; U+2581 = E2 96 81
        stosw
        mov     al, 0x81
.copy:
        stosb
        jmp     .normalise
.normalised:
        mov     r13, rdi                ; text end
        sub     rdi, r15
        mov     eax, [rbx+HDR_MAX_PIECE_LEN]
        mov     ecx, [rbp+V_CTX_LEN]
        imul    rax, rcx
        cmp     rdi, rax
        ja      err_long_prompt

        mov     rsi, r15                ; rsi = position, r10 -> the next symbol
        mov     r10, r14
.symbol:
        mov     rdx, r13
        sub     rdx, rsi                ; bytes left
        jz      .symbols_done
        mov     r8, [rbp+V_USER]
        mov     r9d, [rbx+HDR_N_USER]
        lea     r9, [r8+r9*4]
.user:
        cmp     r8, r9
        jae     .character
        mov     eax, [r8]
        add     r8, 4
        call    piece
        cmp     rcx, rdx
        ja      .user
        push    rsi
        repe    cmpsb                   ; ecx >= 1 (load_model)
        pop     rsi
        jne     .user
        mov     edx, [r11+PIECE_LEN]
        jmp     .push
.character:
        ; UTF-8: the lead byte gives the length; a byte that does not start a complete,
        ; well-formed sequence is a symbol of its own. The text is followed by zero bytes,
        ; which are not continuation bytes.
        mov     al, [rsi]
        push    1
        pop     rdx
        cmp     al, 0xC0
        jb      .free
        inc     edx
        cmp     al, 0xE0
        jb      .continuation
        inc     edx
        cmp     al, 0xF0
        jb      .continuation
        inc     edx
        cmp     al, 0xF8
        jae     .single
.continuation:
        mov     ecx, 1
.next_byte:
        mov     al, [rsi+rcx]
        and     al, 0xC0
        cmp     al, 0x80
        jne     .single
        inc     ecx
        cmp     ecx, edx
        jb      .next_byte
        jmp     .free
.single:
        push    1
        pop     rdx
.free:
        or      eax, -1
.push:
        mov     ecx, esi
        sub     ecx, r15d
        mov     [r10], ecx              ; start
        mov     [r10+4], eax            ; tag
        add     r10, 8
        add     rsi, rdx
        jmp     .symbol
.symbols_done:
        mov     ecx, esi
        sub     ecx, r15d
        mov     [r10], ecx              ; the sentinel: start = text length
        sub     r10, r14
        shr     r10d, 3
        mov     r13d, r10d              ; symbols

; A merge pass: rdi -> symbol j, [rsp] -> the best pair's left symbol (-1: none), xmm1 its
; score.
.pass:
        push    -1
        mov     rdi, r14
.pair:
        lea     rax, [r14+r13*8-8]
        cmp     rdi, rax
        jae     .pass_done
        mov     eax, [rdi+4]
        and     eax, [rdi+12]
        inc     eax                     ; both tags -1: both free
        jnz     .next_pair
        mov     esi, [rdi]
        mov     edx, [rdi+16]           ; the pair ends where symbol j+2 starts
        sub     edx, esi
        add     rsi, r15
        call    lookup
        test    eax, eax
        js      .next_pair
        movss   xmm0, [r11+PIECE_SCORE]
        cmp     qword [rsp], -1
        je      .best
        ucomiss xmm0, xmm1
        jbe     .next_pair              ; not higher (or NaN): the leftmost stays
.best:
        mov     [rsp], rdi
        movaps  xmm1, xmm0
.next_pair:
        add     rdi, 8
        jmp     .pair
.pass_done:
        pop     rdi
        cmp     rdi, -1
        je      .merged
        lea     rcx, [r14+r13*8+8]      ; drop symbol best+1: move best+2 .. sentinel down
        lea     rsi, [rdi+16]
        add     rdi, 8
        sub     rcx, rsi
        shr     ecx, 3
        dec     r13d
        rep     movsq
        jmp     .pass

; Emit: r13 -> symbol, r14 = the sentinel, rdi -> the next id.
.merged:
        mov     rdi, r12
        mov     eax, [rbx+HDR_BOS]
        stosd
        lea     rax, [r14+r13*8]
        mov     r13, r14
        xchg    r14, rax
.emit:
        cmp     r13, r14
        jae     .emitted
        mov     eax, [r13+4]
        cmp     eax, -1
        jne     .store                  ; a user-defined piece
        mov     esi, [r13]
        mov     edx, [r13+8]
        sub     edx, esi
        add     rsi, r15
        call    lookup
        test    eax, eax
        jns     .store
.byte:
        lodsb                           ; byte fallback: <0xHH> = byte_base + HH
        movzx   eax, al
        add     eax, [rbx+HDR_BYTE_BASE]
        dec     edx
        jz      .store
        stosd
        jmp     .byte
.store:
        stosd
        add     r13, 8
        jmp     .emit
.emitted:
        sub     rdi, r12
        shr     edi, 2
        mov     r13d, edi
        cmp     edi, [rbp+V_CTX_LEN]
        ja      err_long_prompt
        ret

; lookup: the normal piece whose bytes equal [rsi, rsi + rdx), by binary search in the index
; (sorted by unsigned bytes, a proper prefix first).
;   in: rsi bytes, edx length, rbx header   out: eax id and r11 -> its record, or eax = -1
;   clobbers: rcx r8-r11
lookup:
        push    rdi
        xor     r8d, r8d                ; lo
        mov     r9d, [rbx+HDR_N_INDEX]  ; hi
.probe:
        cmp     r8, r9
        jae     .none
        lea     r10, [r8+r9]
        shr     r10, 1                  ; mid
        mov     rax, [rbp+V_INDEX]
        mov     eax, [rax+r10*4]
        call    piece
        push    rsi
        cmp     edx, ecx                ; when the shorter length is 0 these flags decide
        cmovb   ecx, edx
        repe    cmpsb
        pop     rsi
        jne     .decided
        cmp     edx, [r11+PIECE_LEN]    ; equal up to the shorter: the shorter sorts first
        je      .found
.decided:
        ja      .right
        mov     r9, r10
        jmp     .probe
.right:
        lea     r8, [r10+1]
        jmp     .probe
.none:
        or      eax, -1
.found:
        pop     rdi
        ret

err_long_prompt:
        call    fatal_here
        db      'prompt too long', 0
