; chat.asm: conversation mode (-cnv). The turns come from -p or -f, then from standard input
; one line each; each is wrapped in the model's turn template (the strings section,
; docs/format.md "Strings"), tokenized and fed from the conversation's position, so the KV
; cache runs on from turn to turn and nothing before a turn is computed again (docs/chat.md).

SYS_ioctl       = 16
TCGETS          = 0x5401        ; succeeds on a terminal only
LINE_MAX        = PROMPT_FILE_MAX       ; a line of this many bytes or more is refused
TURN_MAX        = 1 shl 25      ; a turn's text: the strings (N_STRINGS * STRING_MAX bytes at
                                ; most), -sys (an argument: < 2^17 bytes), the line's text

; chat_next, chat_refused, chat: the conversation (setup's tail with -cnv), one routine with
; three entries. chat (from main.asm's generate, once): the turns' memory, the first turn from
; -p or -f. chat_next (from generate, after each reply and its newline, flushed): the next
; line of standard input. chat_refused (from fatal_status: a turn refused, its message out,
; rsp as at chat_next): the position back (tokenize overwrote r15) and the header (fatal_here
; rbx), then chat_next. Each turn: the text trimmed of ASCII whitespace (skipped when
; empty), then with the strings around it: the first turn SYS_BEGIN sys SYS_END text USER_END
; with -sys, else USER_BEGIN text USER_END; every later turn REPLY_END USER_BEGIN text
; USER_END. Its ids (BOS only on the first) follow the id that ended the last reply when -n
; ended it (pending), else none; generate.run feeds them from position r15 and samples the
; reply. A turn refused (too long, a NUL byte) leaves the conversation as it was.
;   in: rbx header, rbp front_base, r15d the position (0 at chat), out_buf empty (nothing
;   is put between the entries: the marker and refusals go to stderr)   out: never returns
;   (exit 0 at the end of the input; a full context: main.asm's notice, exit 0)
chat_refused:
        mov     r15d, [rbp+V_POS]
        mov     rbx, [rbp+V_BASE]
chat_next:
        mov     [rbp+V_POS], r15d
        mov     [rbp+V_CHAT_RSP], rsp   ; (fatal_here: a refusal comes back to chat_refused)
        xor     edi, edi                ; standard input a terminal: a marker on stderr
        mov     esi, TCGETS
        lea     edx, [rbp+V_OUT_BUF]    ; (its struct termios: out_buf is empty)
        mov     al, SYS_ioctl
        call    sys_call
        jnz     .read
        mov     esi, msg_marker
        call    put_err
.read:                                  ; the line, at rsi on, bytes one read each
        mov     esi, TURN_MAX + 1
        add     rsi, [rbp+V_PROMPT]
        push    rsi
        lea     r13, [rsi+LINE_MAX]
.byte:
        mov     edi, [rbp+V_STDIN]      ; standard input (-1 when the model took it: no input)
        push    1
        pop     rdx
        mov     al, SYS_read
        call    sys_call
        jle     .input_end              ; (a failed read: the same)
        lodsb
        cmp     al, 10
        je      .newline
        cmp     rsi, r13
        jbe     .byte
        dec     rsi                     ; LINE_MAX bytes: the rest goes over the last one
        jmp     .byte
.newline:                               ; a \r before it goes; a '\' before it: both one \n
        dec     rsi
        cmp     byte [rsi-1], 13
        jne     .lf
        dec     rsi
.lf:
        cmp     byte [rsi-1], '\'
        jne     .line
        mov     byte [rsi-1], 10
        jmp     .byte
.input_end:
        cmp     rsi, [rsp]
        je      exit_ok                 ; nothing: the conversation ends
.line:                                  ; [rsp] -> the line's first byte, rsi -> its end
        mov     byte [rsi], 0
        cmp     rsi, r13
        jae     tokenize.err_long_prompt        ; (refused: fatal_here)
        pop     rdi
        push    rdi
        call    no_nul
        pop     rsi
        jmp     chat.turn
chat:
        mov     edi, TURN_MAX + LINE_MAX + 2
        call    alloc                   ; the turn's text, then the line (a zero byte before it)
        mov     rsi, [rbp+V_PROMPT]     ; the first turn: -p or -f (empty: none)
        mov     [rbp+V_PROMPT], rax     ; from now on each turn's text (tokenize)
.turn:                                  ; rsi -> the turn's text (zero-terminated)
        push    rsi
        mov     rdi, [rbp+V_PROMPT]
        test    r15d, r15d
        jnz     .later
        mov     rsi, [rbp+V_SYS]
        test    rsi, rsi
        jz      .user
        mov     al, S_SYS_BEGIN
        call    put_string
        call    put_text
        mov     al, S_SYS_END
        jmp     .open
.later:
        mov     al, S_REPLY_END
        call    put_string
.user:
        mov     al, S_USER_BEGIN
.open:
        call    put_string
        pop     rsi
.lead:                                  ; the text trimmed of ASCII whitespace (\t \n \v
        lodsb                           ; \f \r, space) at both ends
        test    al, al
        jz      chat_next               ; empty: skipped
        cmp     al, ' '
        je      .lead
        sub     al, 9
        cmp     al, 5
        jb      .lead
        dec     rsi
        call    put_text
.trail:                                 ; (it stops at the text's first byte at the latest)
        mov     al, [rdi-1]
        cmp     al, ' '
        je      .space
        sub     al, 9
        cmp     al, 5
        jae     .close
.space:
        dec     rdi
        jmp     .trail
.close:
        mov     al, S_USER_END
        call    put_string
        mov     [rdi], cl               ; (0: rep movsb's count)
        call    tokenize                ; pending, then the turn's ids from position r15
        and     qword [rbp+V_CHAT_RSP], 0       ; (errors from here on are fatal)
        jmp     generate.run

; put_string: append a string of the strings section (load_model checked it lies inside).
;   in: al its record's offset (S_*), rdi destination   out: rdi after it
;   clobbers: rax rcx
put_string:
        push    rsi
        movzx   eax, al
        mov     rsi, [rbp+V_STRINGS]
        mov     ecx, [rsi+rax+4]
        mov     eax, [rsi+rax]
        add     rsi, rax
        rep     movsb
        pop     rsi
        ret

; put_text: append a zero-terminated string (without its zero).
;   in: rsi string, rdi destination   out: rdi after it, al = 0   clobbers: rsi
put_text:
        lodsb
        stosb
        test    al, al
        jnz     put_text
        dec     rdi
        ret
