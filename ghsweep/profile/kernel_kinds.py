"""What a GPU kernel is, told by its name: a matrix multiply (GEMM), an fp8 GEMM, an optimizer
update; and the base function name that nsys (shortName) and Nsight Compute match on.

Names seen on real runs: cuBLASLt on Hopper launches `nvjet_sm90_<types>_...` kernels whose type
code starts with the A/B operand types: `tst` is bf16, `qqtst` e4m3 x e4m3 and `qrtst` e4m3 x
e5m2 (torchao float8 forward and backward); older cuBLAS and cutlass name the types
(`sm90_xmma_gemm_e4m3e4m3_...`, `cutlass3x_sm90_tensorop_gemm_e4m3_...`, Transformer Engine's
`..._fp8_...`), torch's `_scaled_mm` row-wise kernels are `f8f8bf16_rowwise`.
"""

from __future__ import annotations

import re

GEMM = re.compile(r"gemm|nvjet|xmma|matmul|scaled_mm|wgmma|f8f8|cutlass.*(tensorop|simt)", re.IGNORECASE)
# Attention kernels are built from cutlass/xmma pieces too; they are not the GEMMs fp8 replaces.
ATTENTION = re.compile(r"flash|attention|sdpa|fmha|mha_", re.IGNORECASE)
FP8 = re.compile(r"e4m3|e5m2|fp8|float8|f8f8|scaled_mm|^nvjet_sm\d+[a-z]?_[qr]", re.IGNORECASE)
# NCCL's collectives run as kernels (ncclKernel_AllReduce_..., ncclDevKernel_ReduceScatter_...).
NCCL = re.compile(r"nccl", re.IGNORECASE)
# ... or on the copy engines, no kernel at all: NCCL's Copy Engine All-Gather (FSDP2 under
# backend.fsdp_all_gather=copy_engine) moves each rank's share as peer-to-peer copies, named by their
# direction as every copy is (engine.MEMCPY_KIND, torch_trace.op_label).
PEER_COPY = "Memcpy PtoP"
OPTIMIZER = re.compile(r"adam|multi_tensor_apply|sgd|lamb|lion|adafactor|optimizer", re.IGNORECASE)


# Inductor numbers the Triton kernels it generates within a compiled graph (triton_poi_fused_add_5):
# the same kernel gets another number in another run, e.g. on another number of GPUs.
INDUCTOR_INDEX = re.compile(r"(triton_[a-z]+_.+)_\d+")


def kernel_family(name: str) -> str:
    """The name without Inductor's per-graph index, to line up one kernel across runs."""
    match = INDUCTOR_INDEX.fullmatch(name)
    return match.group(1) if match else name


# The families a step's kernel time is told in across runs (delta.py), whatever the kernels' generated
# names: GEMMs by their operand dtype, attention, Inductor's and ATen's elementwise kernels (casts,
# fp8's scaling and amax among them), the optimizer, each NCCL collective with its dtype, copies.
GEMM_DTYPES = (
    ("fp8", FP8),
    # cuBLASLt on Hopper: nvjet_sm90_tst_* is bf16 in, bf16 out; older names spell the type.
    ("bf16", re.compile(r"bf16|^nvjet_sm\d+[a-z]?_t", re.IGNORECASE)),
    ("fp16", re.compile(r"fp16|f16f16|hgemm|_h16|^nvjet_sm\d+[a-z]?_h", re.IGNORECASE)),
    ("fp32/tf32", re.compile(r"sgemm|tf32|f32f32|^nvjet_sm\d+[a-z]?_s", re.IGNORECASE)),
)
ELEMENTWISE = re.compile(r"elementwise|cast|amax|scale", re.IGNORECASE)
COPY = re.compile(r"^Memcpy|^Memset|copy|chunk_cat|CatArray", re.IGNORECASE)
NCCL_COLLECTIVE = re.compile(
    r"nccl\w*?Kernel_(?P<collective>[A-Za-z]+)(?:_\w*?(?P<dtype>bf16|f16|f32|f64|[iu]8|[iu]32|[iu]64|f8e4m3|f8e5m2))?"
)
ELEMENTWISE_FAMILY = "fused elementwise / casts"
PEER_COPIES_FAMILY = "peer-to-peer copies"


def step_family(name: str) -> str:
    """The family a kernel's (or copy's) time counts to when two runs are compared: `bf16 GEMMs`,
    `fp8 GEMMs`, `attention`, `fused elementwise / casts`, `optimizer`, `NCCL ReduceScatter f32`,
    `peer-to-peer copies` (communication on the copy engines), `copies`, `other`."""
    if name == PEER_COPY:
        return PEER_COPIES_FAMILY
    if is_nccl(name):
        found = NCCL_COLLECTIVE.search(name)
        if not found:
            return "NCCL"
        return " ".join(p for p in ("NCCL", found["collective"], found["dtype"]) if p)
    if ATTENTION.search(name):
        return "attention"
    if is_gemm(name):
        return next((f"{dtype} GEMMs" for dtype, pattern in GEMM_DTYPES if pattern.search(name)), "GEMMs")
    if is_optimizer(name):
        return "optimizer"
    if name.startswith("triton_"):  # Inductor's fused kernels (to_copy in their names is a cast)
        return ELEMENTWISE_FAMILY
    if COPY.search(name):
        return "copies"
    if ELEMENTWISE.search(name):
        return ELEMENTWISE_FAMILY
    return "other"


def is_gemm(name: str) -> bool:
    return bool(GEMM.search(name)) and not ATTENTION.search(name)


def is_fp8_gemm(name: str) -> bool:
    return is_gemm(name) and bool(FP8.search(name))


def is_nccl(name: str) -> bool:
    return bool(NCCL.search(name))


def is_communication(name: str) -> bool:
    """Data moving between GPUs: an NCCL kernel, or a peer-to-peer copy (NCCL's copy-engine collectives)."""
    return is_nccl(name) or name == PEER_COPY


def is_optimizer(name: str) -> bool:
    return bool(OPTIMIZER.search(name))


def gemm_time(kernels: list[dict]) -> dict[str, float]:
    """GEMM and fp8-GEMM time (ns) of ranked kernels ({name, total_ns})."""
    gemm = [k for k in kernels if is_gemm(k["name"])]
    return {
        "gemm_ns": sum(k["total_ns"] for k in gemm),
        "fp8_gemm_ns": sum(k["total_ns"] for k in gemm if is_fp8_gemm(k["name"])),
    }


def _strip_brackets(text: str, open_: str, close: str) -> str:
    """`text` without the (nested) bracketed parts."""
    out, depth = [], 0
    for ch in text:
        if ch == open_:
            depth += 1
        elif ch == close and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


def function_name(demangled: str) -> str:
    """The base function name of a demangled kernel name, as nsys's shortName:
    `void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>(...)` ->
    `multi_tensor_apply_kernel`; a plain name (`nvjet_sm90_tst_...`) is itself."""
    name = demangled.replace("(anonymous namespace)", "{anonymous}")
    name = _strip_brackets(_strip_brackets(name, "<", ">"), "(", ")").strip()
    name = name.split()[-1] if name else demangled
    return name.rsplit("::", 1)[-1] or demangled
