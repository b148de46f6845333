"""Whether this process's glibc malloc runs with tune_allocator's settings.

IN_HEAP is source text defining `tuned()`, so that a child Python or a Ray actor process can run
it as it is (exec), with nothing of the test suite to import there. A chunk that glibc mapped on
its own has the IS_MMAPPED bit (2) set in the size word just before the block. Tuned, a 256 KiB
block comes from an arena, and a 4.5 MiB one is mapped even after a 5 MiB block was freed;
untuned, the first is mapped in a fresh process, and a long-lived one (a Ray worker) may have
raised glibc's dynamic threshold so far that neither is, which the second check tells apart.
"""

IN_HEAP = """
import ctypes

def tuned():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def mapped(size):
        p = libc.malloc(size)
        flag = ctypes.c_size_t.from_address(p - ctypes.sizeof(ctypes.c_size_t)).value & 2
        return p, bool(flag)

    small, small_mapped = mapped(256 << 10)
    libc.free(libc.malloc(5 << 20))  # untuned, freeing a mapped 5 MiB block raises the threshold past it
    large, large_mapped = mapped(9 << 19)
    libc.free(small)
    libc.free(large)
    return not small_mapped and large_mapped
"""
