"""memory=unified: PyTorch allocates from CUDA managed (unified) memory.

Set up in the worker before anything touches CUDA. With RMM installed (RAPIDS; as in NVIDIA's
Grace Hopper guides) PyTorch draws from RMM's managed-memory pool; otherwise from a small
allocator built here around the driver's cuMemAllocManaged (with exact-size free lists, as
training allocates the same sizes every step), plugged in through CUDAPluggableAllocator. Both are
capped at the GPU's free memory, so a run can never ask the driver for more managed memory than the card has free.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import tempfile
from pathlib import Path

import torch

from ghsweep.config.schema import MemorySchema, carried
from ghsweep.core.gpu import GpuInfo

# Free GPU memory left to the CUDA context, cuBLAS workspaces and the rest.
UNIFIED_HEADROOM_GIB = 4.0

_SHIM_SOURCE = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { int type; int id; } CUmemLocation;  /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */

static CUresult (*alloc_managed)(CUdeviceptr *, size_t, unsigned int);
static CUresult (*mem_free)(CUdeviceptr);
static CUresult (*mem_advise)(CUdeviceptr, size_t, int, CUmemLocation);
static CUresult (*prefetch)(CUdeviceptr, size_t, CUmemLocation, unsigned int, void *);
static size_t cap_bytes, held_bytes, peak_bytes;
static int do_prefetch;

/* cuMemAllocManaged costs far too much to call per tensor: freed blocks are kept in exact-size
   free lists (training allocates the same sizes every step) and handed out again. */
#define SLOTS 8192
typedef struct { size_t size; int count, capacity; void **ptrs; } Bucket;
static Bucket buckets[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static size_t rounded(size_t size) {
    size_t unit = size > (1 << 20) ? (2 << 20) : 512;
    return (size + unit - 1) / unit * unit;
}

static Bucket *bucket_of(size_t size) {
    for (size_t i = 0, h = (size / 512) % SLOTS; i < SLOTS; i++) {
        Bucket *b = &buckets[(h + i) % SLOTS];
        if (b->size == size || b->size == 0) { b->size = size; return b; }
    }
    return NULL;
}

static void release_cached(void) {
    for (int i = 0; i < SLOTS; i++)
        for (; buckets[i].count > 0; buckets[i].count--) {
            mem_free((CUdeviceptr)buckets[i].ptrs[buckets[i].count - 1]);
            held_bytes -= buckets[i].size;
        }
}

size_t ghsweep_managed_peak(void) { return peak_bytes; }

int ghsweep_managed_init(size_t cap, int prefetch_to_gpu) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cuda) return 1;
    alloc_managed = dlsym(cuda, "cuMemAllocManaged");
    mem_free = dlsym(cuda, "cuMemFree_v2");
    mem_advise = dlsym(cuda, "cuMemAdvise_v2");
    prefetch = dlsym(cuda, "cuMemPrefetchAsync_v2");
    cap_bytes = cap;
    do_prefetch = prefetch_to_gpu;
    return alloc_managed && mem_free ? 0 : 2;
}

void *ghsweep_managed_malloc(size_t size, int device, void *stream) {
    size = rounded(size);
    pthread_mutex_lock(&lock);
    Bucket *b = bucket_of(size);
    if (b && b->count > 0) {
        void *ptr = b->ptrs[--b->count];
        pthread_mutex_unlock(&lock);
        return ptr;
    }
    if (held_bytes + size > cap_bytes) release_cached();
    if (held_bytes + size > cap_bytes) { pthread_mutex_unlock(&lock); return NULL; }  /* PyTorch: OOM */
    CUdeviceptr ptr = 0;
    if (alloc_managed(&ptr, size, 1 /* CU_MEM_ATTACH_GLOBAL */) != 0) { pthread_mutex_unlock(&lock); return NULL; }
    held_bytes += size;
    if (held_bytes > peak_bytes) peak_bytes = held_bytes;
    pthread_mutex_unlock(&lock);
    CUmemLocation gpu = {1, device};
    if (mem_advise) mem_advise(ptr, size, 3 /* CU_MEM_ADVISE_SET_PREFERRED_LOCATION */, gpu);
    if (do_prefetch && prefetch) prefetch(ptr, size, gpu, 0, stream);
    return (void *)ptr;
}

void ghsweep_managed_free(void *ptr, size_t size, int device, void *stream) {
    size = rounded(size);
    pthread_mutex_lock(&lock);
    Bucket *b = bucket_of(size);
    if (b && b->count == b->capacity) {
        b->capacity = b->capacity ? 2 * b->capacity : 8;
        b->ptrs = realloc(b->ptrs, b->capacity * sizeof(void *));
    }
    if (b) b->ptrs[b->count++] = ptr;
    else { mem_free((CUdeviceptr)ptr); held_bytes -= size; }
    pthread_mutex_unlock(&lock);
}
"""


def _build_shim() -> Path:
    digest = hashlib.sha256(_SHIM_SOURCE.encode()).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"ghsweep_managed_alloc_{digest}.so"
    if not out.exists():
        src = out.with_suffix(".c")
        src.write_text(_SHIM_SOURCE)
        tmp = out.with_suffix(".so.tmp")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src), "-ldl"], check=True)
        tmp.rename(out)
    return out


class ManagedMemory:
    """Which allocator serves managed memory, and the most it has held (GiB), where it can tell."""

    def __init__(self, allocator: str, lib=None):
        self.allocator = allocator
        self._lib = lib

    def peak_gib(self) -> float | None:
        if self._lib is None:
            return None
        self._lib.ghsweep_managed_peak.restype = ctypes.c_size_t
        return self._lib.ghsweep_managed_peak() / 2**30


def setup_unified_memory(memory_config: MemorySchema, gpu: GpuInfo | None) -> ManagedMemory:
    """memory=unified for this process, capped at the GPU's free memory (`gpu`: the run plan's,
    probed on the node before the worker started) less some headroom."""
    if gpu is None:
        raise RuntimeError("memory=unified: no NVIDIA GPU visible to the worker")
    cap_gib = gpu.free_mem_gib - UNIFIED_HEADROOM_GIB
    return enable_managed_memory(
        cap_gib, memory_config.pool_size_gb, carried(memory_config.prefetch, "memory.prefetch")
    )


def enable_managed_memory(cap_gib: float, pool_gib: float | None, prefetch: bool) -> ManagedMemory:
    """Route PyTorch's CUDA allocations to managed memory, at most `cap_gib` of it."""
    cap = int(cap_gib * 2**30)
    try:
        import rmm
        from rmm.allocators.torch import rmm_torch_allocator
    except ImportError:
        rmm = None
    if rmm is not None:
        pool = int(pool_gib * 2**30) if pool_gib else None
        rmm.reinitialize(managed_memory=True, pool_allocator=True, initial_pool_size=pool, maximum_pool_size=cap)
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        return ManagedMemory("rmm_managed_pool")
    shim = _build_shim()
    lib = ctypes.CDLL(str(shim))
    if lib.ghsweep_managed_init(ctypes.c_size_t(cap), int(prefetch)) != 0:
        raise RuntimeError("memory=unified: the CUDA driver (libcuda.so.1) has no cuMemAllocManaged")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(str(shim), "ghsweep_managed_malloc", "ghsweep_managed_free")
    torch.cuda.memory.change_current_allocator(allocator)
    return ManagedMemory("cuMemAllocManaged", lib)
