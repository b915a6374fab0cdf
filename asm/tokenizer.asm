; tokenizer.asm: the prompt's token ids (CONTRACTS.md "Tokenizer rules", the twin of
; builder/tokenizer.py step for step). A symbol is a run of the normalised text, a record of
; SYM bytes. Symbols are contiguous: symbol j ends where j+1 starts; a sentinel record holds
; the text's end. Each record caches its pair with the next symbol, so that a merge pass is
; a scan and only the two pairs around a merge are looked up again.

SYM             = 16
SYM_START       = 0             ; u32 offset in the text
SYM_TAG         = 4             ; u32 id of a matched user-defined piece (never merged), or -1
SYM_SCORE       = 8             ; f32 score of the pair's piece
SYM_PAIR        = 12            ; u32 id of the normal piece of this and the next symbol, or -1

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
        imul    rdi, r14, 24
        call    alloc                   ; text [n3 bytes] | ids [4 * n3] | ... | symbols [16 * n3]
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
        push    1
        pop     rcx
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
        mov     [r10+SYM_START], ecx
        mov     [r10+SYM_TAG], eax
        add     r10, SYM
        add     rsi, rdx
        jmp     .symbol
.symbols_done:
        mov     ecx, esi
        sub     ecx, r15d
        mov     [r10], ecx              ; the sentinel: start = text length
        mov     r13, r10
        mov     rdi, r14
.score_all:
        cmp     rdi, r13
        jae     .pass
        call    pair_score
        add     rdi, SYM
        jmp     .score_all

; A merge pass: rdi -> symbol j, [rsp] -> the best pair's left symbol (-1: none), xmm1 its
; score. Merging drops symbol best+1 and rescores the two pairs the merged symbol is in.
.pass:
        push    -1
        mov     rdi, r14
.pair:
        cmp     rdi, r13
        jae     .pass_done
        cmp     dword [rdi+SYM_PAIR], -1
        je      .next_pair
        movss   xmm0, [rdi+SYM_SCORE]
        cmp     qword [rsp], -1
        je      .best
        ucomiss xmm0, xmm1
        jbe     .next_pair              ; not higher (or NaN): the leftmost stays
.best:
        mov     [rsp], rdi
        movaps  xmm1, xmm0
.next_pair:
        add     rdi, SYM
        jmp     .pair
.pass_done:
        pop     rdi
        cmp     rdi, -1
        je      .merged
        push    rdi
        lea     rsi, [rdi+2*SYM]        ; move best+2 .. the sentinel down one
        add     rdi, SYM
        lea     rcx, [r13+SYM]
        sub     rcx, rsi
        shr     ecx, 3
        rep     movsq
        sub     r13, SYM
        pop     rdi
        call    pair_score
        cmp     rdi, r14
        je      .pass
        sub     rdi, SYM
        call    pair_score
        jmp     .pass

; Emit: r14 -> symbol, r13 = the sentinel, rdi -> the next id.
.merged:
        mov     rdi, r12
        mov     eax, [rbx+HDR_BOS]
        stosd
.emit:
        cmp     r14, r13
        jae     .emitted
        mov     eax, [r14+SYM_TAG]
        cmp     eax, -1
        jne     .store                  ; a user-defined piece
        mov     esi, [r14+SYM_START]
        mov     edx, [r14+SYM+SYM_START]
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
        add     r14, SYM
        jmp     .emit
.emitted:
        sub     rdi, r12
        shr     edi, 2
        mov     r13d, edi
        cmp     edi, [rbp+V_CTX_LEN]
        ja      err_long_prompt
        ret

; pair_score: cache the pair of symbol rdi and the next one: SYM_PAIR = the id of the
; normal piece of their bytes and SYM_SCORE its score; SYM_PAIR = -1 when the next one is
; the sentinel, either is a user-defined piece, or the bytes are no normal piece.
;   in: rdi -> symbol, r13 -> sentinel, r15 text   out: -   clobbers: rax rcx rdx rsi r8-r11
pair_score:
        or      dword [rdi+SYM_PAIR], -1
        lea     rax, [rdi+SYM]
        cmp     rax, r13
        jae     .none
        mov     eax, [rdi+SYM_TAG]
        and     eax, [rdi+SYM+SYM_TAG]
        inc     eax                     ; both tags -1: both free
        jnz     .none
        mov     esi, [rdi+SYM_START]
        mov     edx, [rdi+2*SYM+SYM_START]
        sub     edx, esi
        add     rsi, r15
        call    lookup
        test    eax, eax
        js      .none
        mov     [rdi+SYM_PAIR], eax
        mov     eax, [r11+PIECE_SCORE]
        mov     [rdi+SYM_SCORE], eax
.none:
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
