"""A Ctrl-C that is still pending in Python as the script's KeyboardInterrupt leaves it: the second of two Ctrl-C
a moment apart, made deterministic. The first one's handler trips the second through Python's C API and raises
KeyboardInterrupt, as the default handler does. Nothing may call out between the two (a call runs pending handlers):
the trip's result converter fails in C, and the exception is raised as a class, not called."""

import ctypes
import os
import signal

trip_ctrl_c = ctypes.pythonapi.PyErr_SetInterrupt
trip_ctrl_c.restype = bytes.fromhex  # fails on the int it is given: the call errors, running no handler after it
tripped = []


def on_ctrl_c(signum, frame):
    if not tripped:
        tripped.append(signum)
        try:
            trip_ctrl_c()
        except TypeError:
            raise KeyboardInterrupt from None
    raise KeyboardInterrupt


signal.signal(signal.SIGINT, on_ctrl_c)
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGINT)
