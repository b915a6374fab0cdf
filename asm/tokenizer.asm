; tokenizer.asm: the prompt's token ids (CONTRACTS.md "Tokenizer rules", the twin of
; builder/tokenizer.py step for step). A symbol is a run of the normalised text: a qword of
; (u32 start, u32 tag), tag = the id of a matched user-defined piece (never merged) or -1.
; Symbols are contiguous: symbol j ends where j+1 starts; a sentinel holds the text's end.

; tokenize: spaces -> U+2581; user-defined pieces (longest first) or one UTF-8 character per
; symbol; merge the adjacent free pair whose bytes are the best-scoring normal piece
; (leftmost on ties) until none is; each symbol -> its id, or one byte piece per byte.
;   in: - (opt_prompt, the model tables)   out: r12 -> ids (BOS first), r13d = their count
;   clobbers: everything else but rsp (fatal "prompt longer than the context" when the text
;   alone proves it: more bytes than ctx_len * max_piece_len)
tokenize:
        mov     rsi, [opt_prompt]
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
        lea     rbx, [rcx+rcx*2+4]      ; n3 >= 3*length + 3 (the text and 3 zero bytes)
        mov     rdi, rbx
        shl     rdi, 4
        call    alloc                   ; text [n3 bytes] | ids [4*n3] | ... | symbols [8*n3]
        pop     rsi
        mov     r15, rax                ; text
        lea     r12, [rax+rbx]          ; ids
        lea     rbx, [rax+rbx*8]        ; symbols
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
        mov     rbp, rdi                ; text end
        sub     rdi, r15
        mov     rax, [model_base]
        mov     eax, [rax+HDR_MAX_PIECE_LEN]
        mov     ecx, [ctx_len]
        imul    rax, rcx
        cmp     rdi, rax
        ja      err_long_prompt

        mov     rsi, r15                ; rsi = position, rdi = next symbol slot
        mov     rdi, rbx
.symbol:
        mov     r8, [user_ptr]
        mov     rax, [model_base]
        mov     r9d, [rax+HDR_N_USER]
        mov     rdx, rbp
        sub     rdx, rsi                ; bytes left
        jz      .symbols_done
.user:
        test    r9d, r9d
        jz      .character
        dec     r9d
        mov     eax, [r8]
        add     r8, 4
        mov     r10, rax
        shl     r10, 4
        add     r10, [pieces_ptr]
        mov     ecx, [r10+PIECE_LEN]    ; >= 1 (load_model)
        cmp     rcx, rdx
        ja      .user
        mov     r11d, [r10+PIECE_BLOB_OFF]
        add     r11, [blob_ptr]
        push    rsi
        push    rdi
        mov     rdi, r11
        repe    cmpsb
        pop     rdi
        pop     rsi
        jne     .user
        mov     edx, [r10+PIECE_LEN]
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
        mov     [rdi], ecx              ; start
        mov     [rdi+4], eax            ; tag
        add     rdi, 8
        add     rsi, rdx
        jmp     .symbol
.symbols_done:
        mov     ecx, esi
        sub     ecx, r15d
        mov     [rdi], ecx              ; the sentinel: start = text length
        sub     rdi, rbx
        shr     edi, 3
        mov     r13d, edi               ; symbols

.pass:
        or      ebp, -1                 ; best pair (its left symbol), none yet
        xor     r14d, r14d              ; j
.pair:
        lea     eax, [r14+1]
        cmp     eax, r13d
        jae     .pass_done
        mov     eax, [rbx+r14*8+4]
        and     eax, [rbx+r14*8+12]
        inc     eax                     ; both tags -1: both free
        jnz     .next_pair
        mov     esi, [rbx+r14*8]
        mov     edx, [rbx+r14*8+16]     ; the pair ends where symbol j+2 starts
        sub     edx, esi
        add     rsi, r15
        call    lookup
        test    eax, eax
        js      .next_pair
        shl     rax, 4
        add     rax, [pieces_ptr]
        movss   xmm0, [rax+PIECE_SCORE]
        test    ebp, ebp
        js      .best
        ucomiss xmm0, xmm1
        jbe     .next_pair              ; not higher (or NaN): the leftmost stays
.best:
        mov     ebp, r14d
        movaps  xmm1, xmm0
.next_pair:
        inc     r14d
        jmp     .pair
.pass_done:
        test    ebp, ebp
        js      .merged
        dec     r13d                    ; drop symbol best+1: move best+2 .. sentinel down
        lea     rdi, [rbx+rbp*8+8]
        lea     rsi, [rdi+8]
        mov     ecx, r13d
        sub     ecx, ebp
        rep     movsq
        jmp     .pass

.merged:
        mov     rdi, r12
        mov     rax, [model_base]
        mov     eax, [rax+HDR_BOS]
        stosd
        xor     r14d, r14d
.emit:
        cmp     r14d, r13d
        jae     .emitted
        mov     eax, [rbx+r14*8+4]
        cmp     eax, -1
        jne     .store                  ; a user-defined piece
        mov     esi, [rbx+r14*8]
        mov     edx, [rbx+r14*8+8]
        sub     edx, esi
        add     rsi, r15
        push    rdi
        call    lookup
        pop     rdi
        test    eax, eax
        jns     .store
.byte:
        movzx   eax, byte [rsi]         ; byte fallback: <0xHH> = byte_base + HH
        inc     rsi
        mov     rcx, [model_base]
        add     eax, [rcx+HDR_BYTE_BASE]
        stosd
        dec     edx
        jnz     .byte
        jmp     .next_symbol
.store:
        stosd
.next_symbol:
        inc     r14d
        jmp     .emit
.emitted:
        sub     rdi, r12
        shr     rdi, 2
        mov     r13d, edi
        ret

; lookup: the normal piece whose bytes equal [rsi, rsi + rdx), by binary search in the index
; (sorted by unsigned bytes, a proper prefix first).
;   in: rsi bytes, edx length   out: eax id, or -1   clobbers: rcx rdi r8-r11
lookup:
        xor     r8d, r8d                ; lo
        mov     rax, [model_base]
        mov     r9d, [rax+HDR_N_INDEX]  ; hi
.probe:
        cmp     r8, r9
        jae     .none
        lea     r10, [r8+r9]
        shr     r10, 1                  ; mid
        mov     rax, [index_ptr]
        mov     eax, [rax+r10*4]        ; its id
        mov     r11, rax
        shl     r11, 4
        add     r11, [pieces_ptr]
        mov     edi, [r11+PIECE_BLOB_OFF]
        add     rdi, [blob_ptr]
        mov     r11d, [r11+PIECE_LEN]
        push    rsi
        cmp     edx, r11d               ; when the shorter length is 0 these flags decide
        mov     ecx, edx
        cmova   ecx, r11d
        repe    cmpsb
        pop     rsi
        jne     .decided
        cmp     edx, r11d               ; equal up to the shorter: the shorter sorts first
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
        ret

err_long_prompt:
        lea     rsi, [msg_long_prompt]
        jmp     fatal
