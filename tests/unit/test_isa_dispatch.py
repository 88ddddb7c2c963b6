"""The CPU kernel's choice of instruction set: what the CPU grants, not only what it advertises.

`granted_isa(leaf1_ecx, leaf7_ebx, xcr0)` is the decision as a pure function of CPUID.1:ECX,
CPUID.(EAX=7,ECX=0):EBX and XCR0 (the register state the OS saves), so these tests feed it
machines we do not have: above all a VM that advertises AVX-512 in CPUID but whose XCR0 has no
zmm state, where running the AVX-512 tiles would die of SIGILL. The last tests check that this
machine's own bits go through the same function to the set the kernel uses.
"""

from __future__ import annotations

import ctypes
import platform
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from vllm_mlx.models.cpu import qmm

try:
    EXT: ModuleType | None = qmm.extension()
except ImportError:
    EXT = None

pytestmark = pytest.mark.skipif(EXT is None, reason="the CPU kernel extension is not built")
x86_64_only = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="CPUID and XCR0 are x86-64's"
)

KERNELS = Path(__file__).resolve().parents[2] / "daemon" / "vllm_mlx" / "kernels"

# CPUID.1:ECX
FMA = 1 << 12
OSXSAVE = 1 << 27
AVX = 1 << 28
F16C = 1 << 29
# CPUID.(EAX=7,ECX=0):EBX
AVX2 = 1 << 5
AVX512F = 1 << 16
AVX512DQ = 1 << 17
AVX512CD = 1 << 28
AVX512BW = 1 << 30
AVX512VL = 1 << 31
# CPUID.(EAX=7,ECX=0):ECX
AVX512_VNNI = 1 << 11
# XCR0
X87, SSE, YMM = 1 << 0, 1 << 1, 1 << 2
OPMASK, ZMM_HI256, HI16_ZMM = 1 << 5, 1 << 6, 1 << 7
XTILECFG, XTILEDATA = 1 << 17, 1 << 18  # AMX's tile state

LEAF1_AVX2 = OSXSAVE | AVX | FMA | F16C
XCR0_AVX2 = X87 | SSE | YMM  # 0x7
XCR0_AVX512 = XCR0_AVX2 | OPMASK | ZMM_HI256 | HI16_ZMM  # 0xe7
# This project's 2-core VM (AMD EPYC, Zen 4: AVX-512 F/BW/VL/DQ/..., no AMX), as read by
# cpu_bits(): real bits, with every feature bit the dispatch does not look at as well.
ZEN4 = (0xFFFA3203, 0xF1BF07AB, 0xE7)
ZEN4_LEAF7_ECX = 0x405FC6  # its CPUID.7.0:ECX (AVX512_VNNI among them), for granted_int8
ALL_ONES_32, ALL_ONES_64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF

RANK = {"scalar": 0, "avx2": 1, "avx512": 2}


def granted(leaf1_ecx: int, leaf7_ebx: int, xcr0: int) -> str:
    assert EXT is not None
    name = EXT.granted_isa(leaf1_ecx, leaf7_ebx, xcr0)
    assert isinstance(name, str)
    return name


def test_a_full_avx512_machine_gets_avx512() -> None:
    assert granted(*ZEN4) == "avx512"
    assert granted(LEAF1_AVX2, AVX2 | AVX512F, XCR0_AVX512) == "avx512"


def test_a_full_avx2_machine_gets_avx2() -> None:
    assert granted(LEAF1_AVX2, AVX2, XCR0_AVX2) == "avx2"
    assert granted(LEAF1_AVX2, AVX2, XCR0_AVX512) == "avx2"  # zmm state, no AVX512F


def test_a_vm_that_advertises_avx512_but_saves_no_zmm_state_gets_avx2() -> None:
    """The failure mode of issue 29: CPUID says AVX-512, the guest's XCR0 grants ymm only."""
    leaf1, leaf7, _ = ZEN4
    assert granted(leaf1, leaf7, XCR0_AVX2) == "avx2"


@pytest.mark.parametrize(
    "missing", [OPMASK, ZMM_HI256, HI16_ZMM], ids=["opmask", "zmm_hi256", "hi16_zmm"]
)
def test_each_piece_of_zmm_state_is_needed(missing: int) -> None:
    leaf1, leaf7, _ = ZEN4
    assert granted(leaf1, leaf7, XCR0_AVX512 & ~missing) == "avx2"


@pytest.mark.parametrize(
    "xcr0", [X87 | SSE, X87, X87 | YMM | OPMASK | ZMM_HI256 | HI16_ZMM, 0], ids=hex
)
def test_avx2_advertised_without_ymm_state_gets_scalar(xcr0: int) -> None:
    """CPUID has AVX2/FMA/F16C (and AVX-512), XCR0 lacks the xmm or ymm state."""
    leaf1, leaf7, _ = ZEN4
    assert granted(leaf1, leaf7, xcr0) == "scalar"
    assert granted(LEAF1_AVX2, AVX2, xcr0) == "scalar"


def test_without_osxsave_xcr0_counts_as_empty() -> None:
    """OSXSAVE clear: the OS has not enabled XSAVE, xgetbv would fault, no ymm is saved.
    Every other bit set, even a (made-up) full XCR0, still gives scalar."""
    assert granted(ALL_ONES_32 & ~OSXSAVE, ALL_ONES_32, ALL_ONES_64) == "scalar"
    assert granted(ALL_ONES_32, ALL_ONES_32, ALL_ONES_64) == "avx512"  # the same with it


@pytest.mark.parametrize(
    ("leaf1_clear", "leaf7_clear"),
    [(FMA, 0), (F16C, 0), (AVX, 0), (0, AVX2)],
    ids=["fma", "f16c", "avx", "avx2"],
)
def test_each_avx2_path_feature_is_needed(leaf1_clear: int, leaf7_clear: int) -> None:
    """The AVX2 functions are target("avx2,fma,f16c"); AVX-512 needs them as well."""
    leaf1, leaf7, xcr0 = ZEN4
    assert granted(leaf1 & ~leaf1_clear, leaf7 & ~leaf7_clear, xcr0) == "scalar"
    assert granted(LEAF1_AVX2 & ~leaf1_clear, AVX2 & ~leaf7_clear, XCR0_AVX2) == "scalar"


def test_avx512_subsets_without_avx512f_get_avx2() -> None:
    leaf1, leaf7, xcr0 = ZEN4
    assert granted(leaf1, leaf7 & ~AVX512F, xcr0) == "avx2"
    assert granted(LEAF1_AVX2, AVX2 | AVX512BW | AVX512VL | AVX512DQ, XCR0_AVX512) == "avx2"


def test_avx512f_alone_is_enough() -> None:
    """The AVX-512 tiles use AVX512F only (the target attributes below say so), so a CPU
    with F but no BW/VL/DQ (Knights Landing: F and CD) runs them."""
    assert granted(LEAF1_AVX2, AVX2 | AVX512F, XCR0_AVX512) == "avx512"
    assert granted(LEAF1_AVX2, AVX2 | AVX512F | AVX512CD, XCR0_AVX512) == "avx512"


@pytest.mark.parametrize("amx_state", [0, XTILECFG, XTILECFG | XTILEDATA], ids=hex)
def test_amx_changes_nothing(amx_state: int) -> None:
    """No AMX is used: its tile state in XCR0 neither adds a set nor stands in for zmm state.
    (AMX's CPUID bits are in leaf 7's EDX, which the dispatch does not read.)"""
    leaf1, leaf7, _ = ZEN4
    assert granted(leaf1, leaf7, XCR0_AVX512 | amx_state) == "avx512"
    assert granted(leaf1, leaf7, XCR0_AVX2 | amx_state) == "avx2"
    assert granted(leaf1, leaf7, X87 | SSE | amx_state) == "scalar"


def granted_int8(leaf1_ecx: int, leaf7_ebx: int, leaf7_ecx: int, xcr0: int) -> bool:
    assert EXT is not None
    answer = EXT.granted_int8(leaf1_ecx, leaf7_ebx, leaf7_ecx, xcr0)
    assert isinstance(answer, bool)
    return answer


def test_int8_tiles_need_avx512_with_bw_vl_and_vnni() -> None:
    """The VNNI int8 tiles (qmm_vnni.cpp, `int8_activations`) are granted on top of the AVX-512
    set only, and each of BW, VL and VNNI is needed; zmm state in XCR0 as for AVX-512."""
    leaf1, leaf7, xcr0 = ZEN4
    assert granted_int8(leaf1, leaf7, ZEN4_LEAF7_ECX, xcr0)
    assert not granted_int8(leaf1, leaf7, ZEN4_LEAF7_ECX & ~AVX512_VNNI, xcr0)
    assert not granted_int8(leaf1, leaf7 & ~AVX512BW, ZEN4_LEAF7_ECX, xcr0)
    assert not granted_int8(leaf1, leaf7 & ~AVX512VL, ZEN4_LEAF7_ECX, xcr0)
    assert not granted_int8(leaf1, leaf7, ZEN4_LEAF7_ECX, XCR0_AVX2)  # advertised, not saved
    assert not granted_int8(leaf1 & ~OSXSAVE, leaf7, ZEN4_LEAF7_ECX, xcr0)
    assert granted_int8(LEAF1_AVX2, AVX2 | AVX512F | AVX512BW | AVX512VL, AVX512_VNNI, XCR0_AVX512)


# The features each target attribute may name, with the CPUID bit the dispatch checks for
# it: (1 for CPUID.1:ECX, 7 for CPUID.7.0:EBX or "7c" for CPUID.7.0:ECX, the bit).
FEATURE_BITS: dict[str, tuple[int | str, int]] = {
    "avx2": (7, AVX2),
    "fma": (1, FMA),
    "f16c": (1, F16C),
    "avx512f": (7, AVX512F),
    "avx512bw": (7, AVX512BW),
    "avx512vl": (7, AVX512VL),
    "avx512vnni": ("7c", AVX512_VNNI),
}
# The macros the kernels put their target attributes in, and the set each belongs to
# ("int8": the int8 tiles, granted by granted_int8).
MACRO_ISA = {"AVX2": "avx2", "AVX512": "avx512", "VNNI": "int8"}


DEFINE = re.compile(r'#define (\w+) __attribute__\(\(target\("([^"]*)"\)\)\)')
# Any way to compile a function for more than the build's baseline.
ANY_TARGET = re.compile(
    r"__attribute__\(\(target\(|gnu::target|#pragma (?:GCC|clang) (?:target|attribute)"
)
# Whole-file ISA flags would let the compiler use more than the target attributes name.
ISA_FLAG = re.compile(r"(?<![\w-])-m(?:arch|avx|fma|f16c|bmi|amx)")


def sources() -> list[Path]:
    return sorted([*KERNELS.glob("*.cpp"), *KERNELS.glob("*.h")])


def target_attributes() -> list[tuple[str, str, str]]:
    """(file, macro, feature) for every feature a kernel's target attribute names."""
    found = []
    for path in sources():
        for macro, features in DEFINE.findall(path.read_text()):
            found.extend((path.name, macro, feature) for feature in features.split(","))
    return found


TARGETS = target_attributes()


def test_every_target_attribute_is_a_macro_of_a_known_set() -> None:
    """So the test below sees them all: none written out on a function, no pragma."""
    for path in sources():
        text = path.read_text()
        defines = DEFINE.findall(text)
        assert len(ANY_TARGET.findall(text)) == len(defines), path.name
        for macro, _ in defines:
            assert macro in MACRO_ISA, f"{path.name}: {macro} is no set the dispatch knows"
    assert not ISA_FLAG.findall((KERNELS / "CMakeLists.txt").read_text())
    assert {MACRO_ISA.get(macro) for _, macro, _ in TARGETS} == {"avx2", "avx512", "int8"}
    assert {"qmm_avx2.cpp", "qmm_avx512.cpp", "dequant.cpp", "qmm_vnni.cpp"} <= {
        name for name, _, _ in TARGETS
    }


@pytest.mark.parametrize(("source", "macro", "feature"), TARGETS)
def test_every_feature_the_kernels_compile_for_is_checked(
    source: str, macro: str, feature: str
) -> None:
    """A machine without a feature a set's functions are compiled for must not get that set.
    Naming a new one (say avx512bw) in a target attribute fails here until granted_isa
    checks its CPUID bit and FEATURE_BITS says which."""
    assert macro in MACRO_ISA, f"{source}: {macro} is no set the dispatch knows"
    assert feature in FEATURE_BITS, f"{source}: the dispatch does not check {feature}"
    leaf, bit = FEATURE_BITS[feature]
    leaf1, leaf7, xcr0 = ZEN4
    leaf7_ecx = ZEN4_LEAF7_ECX
    assert granted(leaf1, leaf7, xcr0) == "avx512"
    if leaf == 1:
        leaf1 &= ~bit
    elif leaf == 7:
        leaf7 &= ~bit
    else:
        leaf7_ecx &= ~bit
    if MACRO_ISA[macro] == "int8":
        assert not granted_int8(leaf1, leaf7, leaf7_ecx, xcr0), (source, feature)
    else:
        assert leaf != "7c", f"{source}: granted_isa reads no CPUID.7.0:ECX bit ({feature})"
        assert RANK[granted(leaf1, leaf7, xcr0)] < RANK[MACRO_ISA[macro]], (source, feature)


@pytest.fixture
def best() -> Iterator[None]:
    yield
    assert EXT is not None
    EXT.set_isa("best")


@x86_64_only
def test_this_machine_gets_what_its_bits_grant(best: None) -> None:
    """The default set is granted_isa of the bits cpu_bits reads; set_isa refuses the sets
    above it and takes those at and below it."""
    assert EXT is not None
    bits = EXT.cpu_bits()
    assert len(bits) == 3 and all(isinstance(b, int) for b in bits)
    choice = granted(*bits)
    EXT.set_isa("best")
    assert EXT.isa() == choice
    for name, rank in RANK.items():
        if rank <= RANK[choice]:
            EXT.set_isa(name)
            assert EXT.isa() == name
        else:
            with pytest.raises(ValueError, match="this CPU has no"):
                EXT.set_isa(name)


@x86_64_only
def test_the_int8_tiles_follow_the_set_in_use(best: None) -> None:
    """VNNI where granted and the set is avx512; AVX2's under avx2 (or avx512 without
    VNNI); none under scalar."""
    assert EXT is not None
    bits = EXT.cpu_bits()
    leaf1, leaf7, xcr0 = bits
    granted_here = granted_int8(leaf1, leaf7, EXT.cpu_leaf7_ecx(), xcr0)
    EXT.set_isa("best")
    if EXT.isa() == "avx512":
        assert EXT.int8_tiles() == ("vnni" if granted_here else "avx2")
    if granted(*bits) != "scalar":
        EXT.set_isa("avx2")
        assert EXT.int8_tiles() == "avx2" and EXT.int8_available()
    EXT.set_isa("scalar")
    assert EXT.int8_tiles() == "none" and not EXT.int8_available()


@x86_64_only
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/cpuinfo and arch_prctl")
def test_cpu_bits_agree_with_the_linux_kernel() -> None:
    """cpu_bits reads the right registers: a feature Linux lists has its CPUID bit set, and
    XCR0's xmm/ymm/zmm bits are the ones Linux reports it enables (ARCH_GET_XCOMP_SUPP)."""
    assert EXT is not None
    leaf1, leaf7, xcr0 = EXT.cpu_bits()
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    assert "sse2" in flags  # the file was read
    # One way only: Linux hides a feature whose state it does not enable, never the reverse.
    listed = {"fma": (leaf1, FMA), "avx": (leaf1, AVX), "f16c": (leaf1, F16C)}
    listed |= {"avx2": (leaf7, AVX2), "avx512f": (leaf7, AVX512F), "avx512bw": (leaf7, AVX512BW)}
    listed |= {"avx512vl": (leaf7, AVX512VL), "avx512_vnni": (EXT.cpu_leaf7_ecx(), AVX512_VNNI)}
    for flag, (word, bit) in listed.items():
        if flag in flags:
            assert word & bit, flag
    if not leaf1 & OSXSAVE:
        assert xcr0 == 0
        return
    libc = ctypes.CDLL(None, use_errno=True)
    supported = ctypes.c_uint64(0)
    arch_prctl, arch_get_xcomp_supp = 158, 0x1021  # x86-64 syscall number; Linux >= 5.16
    if libc.syscall(arch_prctl, arch_get_xcomp_supp, ctypes.byref(supported)) != 0:
        pytest.skip(f"ARCH_GET_XCOMP_SUPP unavailable (errno {ctypes.get_errno()})")
    used = SSE | YMM | OPMASK | ZMM_HI256 | HI16_ZMM
    assert hex(xcr0 & used) == hex(supported.value & used)
