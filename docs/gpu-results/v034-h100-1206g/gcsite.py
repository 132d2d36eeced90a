# Measurement aid (device only, not the worker's): every full collection's time on stderr.
import gc, os, sys, time
_t = [0.0]
def _cb(phase, info):
    if phase == "start":
        _t[0] = time.perf_counter()
    elif info.get("generation") == 2:
        ms = (time.perf_counter() - _t[0]) * 1000
        if ms > 2:
            sys.stderr.write(f"GCTIME pid={os.getpid()} gen2 {ms:.0f} ms frozen={gc.get_freeze_count()} tracked={len(gc.get_objects())}\n")
gc.callbacks.append(_cb)
