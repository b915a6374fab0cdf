; text.asm: read-only strings (zero-terminated), kept in the code segment. Error messages
; live next to the code that raises them (`call fatal_here` / `db 'text', 0`).
; Usage: defaults after '='; -n: until EOS, <end_of_turn> or a full context.

msg_marker:
        db      '> ', 0
msg_full:
        db      'gemma: context full (-c) at ', 0
msg_usage:
        db      'usage: gemma -m MODEL [-p PROMPT | -f FILE] [-cnv [-sys TEXT]] [-n N] [--temp T] [--top-p P]', 10
        db      '  [-s SEED] [-t THREADS] [-c CTX] [--tokens] [--logits FILE] [--baseline] [--avx2] [-h]'
msg_newline:                            ; (also every error message's last byte: fatal_status)
        db      10
empty_text:                             ; (also the usage's terminating 0)
        db      0                       ; the prompt without -p or -f, an error without argument
msg_prefix:
        db      'gemma: ', 0
