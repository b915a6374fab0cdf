; vars.asm: the engine's zero-initialised state. Reserved space takes no file bytes.

argv_base:
        rq      1                       ; argv[0] pointer, set at start-up
