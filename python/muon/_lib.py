"""Loads libmuon.so and declares its C ABI (include/libmuon/muon.h) for ctypes.

Search order for the shared library:
  1. the path in the environment variable MUON_LIBRARY;
  2. libmuon.so next to this package (an installed copy);
  3. bazel-bin/libmuon.so in the repository this package sits in, or
     libmuon.so at its root (the layout of a Bazel runfiles tree);
  4. the system loader: ctypes.util.find_library("muon"), then libmuon.so.1.
"""

import ctypes
import ctypes.util
import os

# ---------------------------------------------------------------------------
# DLPack (dlpack/dlpack.h)
# ---------------------------------------------------------------------------

kDLCPU = 1
kDLCUDA = 2

kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4


class DLDevice(ctypes.Structure):
    _fields_ = [
        ("device_type", ctypes.c_int32),  # DLDeviceType (a C enum: int)
        ("device_id", ctypes.c_int32),
    ]


class DLDataType(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
    ]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# ---------------------------------------------------------------------------
# libmuon (include/libmuon/muon.h)
# ---------------------------------------------------------------------------

STATUS_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
}
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}

ADJUST_LR_ORIGINAL = 0
ADJUST_LR_MATCH_RMS_ADAMW = 1
ADJUST_LR_NONE = 2
ADJUST_LR_SPECTRAL_UNCLAMPED = 3
ADJUST_LR_SPECTRAL = 4

NS_DTYPE_BF16 = 0
NS_DTYPE_FP32 = 1
NS_DTYPE_FP16 = 2
NS_STANDARD = 0
NS_GRAM = 1

NS_COEFFICIENTS_FIXED = 0
NS_COEFFICIENTS_TABLE = 1
NS_COEFFICIENTS_POLAR_EXPRESS = 2
NS_COEFFICIENTS_CANS = 3
NS_COEFFICIENTS_DEEPSEEK_V4 = 4
NS_COEFFICIENTS_CUBIC5 = 5
NS_COEFFICIENTS_AOL = 6

MATRIX_VIEW_2D = 0
MATRIX_VIEW_FLATTEN_TRAILING = 1
MATRIX_VIEW_BATCHED_LEADING = 2

ASSIGNMENT_BALANCED = 0
ASSIGNMENT_ROUND_ROBIN = 1
ASSIGNMENT_CUSTOM = 2
ASSIGNMENT_SPREAD = 3
ASSIGNMENT_SPLIT = 4

PLACEMENT_SHARD = 0
PLACEMENT_FLAT_RANGE = 1
PLACEMENT_REPLICATE = 2

SPLIT_EVEN = 0
SPLIT_CHUNK = 1
SPLIT_SIZES = 2

REPLICATED_HOST_AVERAGED = 0
REPLICATED_ZERO2 = 1

DTYPE_FLOAT32 = 0
DTYPE_BFLOAT16 = 1
DTYPE_FLOAT16 = 2

status_t = ctypes.c_int  # muon_status_t is a C enum


class muon_matrix_info_t(ctypes.Structure):
    _fields_ = [
        ("param_name", ctypes.c_char_p),
        ("index", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("ns_flops", ctypes.c_double),
        ("holders", ctypes.POINTER(ctypes.c_int32)),
        ("num_holders", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
    ]


# muon_options_t.allocate(ctx, bytes, device_type, device_id, stream) and
# release(ctx, ptr, bytes, device_type, device_id, stream)
ALLOCATE_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32,
                               ctypes.c_int32, ctypes.c_void_p)
RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)

# muon_options_t.assign_fn(assign_state, num_matrices, matrices, owners)
ASSIGN_FN = ctypes.CFUNCTYPE(status_t, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.POINTER(muon_matrix_info_t), ctypes.POINTER(ctypes.c_int32))


class muon_options_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("lr", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("momentum", ctypes.c_double),
        ("nesterov", ctypes.c_int32),
        ("ns_steps", ctypes.c_int32),
        ("ns_a", ctypes.c_double),
        ("ns_b", ctypes.c_double),
        ("ns_c", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("ns_coefficients", ctypes.c_int32),
        ("ns_table_rows", ctypes.c_int32),
        ("ns_table", ctypes.POINTER(ctypes.c_double)),
        ("adjust_lr", ctypes.c_int32),
        ("ns_dtype", ctypes.c_int32),
        ("momentum_fp32", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        # 0.2: distributed engine
        ("assignment", ctypes.c_int32),
        ("prefetch_count", ctypes.c_int32),
        ("async_parallelism", ctypes.c_int32),
        ("reserved1", ctypes.c_int32),
        ("round_bytes", ctypes.c_size_t),
        ("assign_fn", ASSIGN_FN),
        ("assign_state", ctypes.c_void_p),
        ("skip_nonfinite", ctypes.c_int32),
        # 0.5: the host's allocator
        ("allocate", ALLOCATE_FN),
        ("release", RELEASE_FN),
        ("allocator_ctx", ctypes.c_void_p),
        ("update_in_grad", ctypes.c_int32),
        # 0.6
        ("update_scale", ctypes.c_double),
        ("cautious_wd", ctypes.c_int32),
        ("reserved2", ctypes.c_int32),
        # 0.7
        ("normuon", ctypes.c_int32),
        ("reserved3", ctypes.c_int32),
        ("normuon_beta2", ctypes.c_double),
        ("normuon_eps", ctypes.c_double),
        ("ns_algorithm", ctypes.c_int32),
        ("skip_nonfinite_updates", ctypes.c_int32),
        ("ns_gram_restarts", ctypes.c_uint64),
    ]


class muon_placement_t(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("group", ctypes.c_int32),
        ("dim", ctypes.c_int32),
        ("split", ctypes.c_int32),
        ("sizes", ctypes.POINTER(ctypes.c_int64)),
        ("start", ctypes.c_int64),
        ("length", ctypes.c_int64),
    ]


class muon_param_options_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("matrix_view", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        # 0.2: distributed layout
        ("global_ndim", ctypes.c_int32),
        ("num_placements", ctypes.c_int32),
        ("global_shape", ctypes.POINTER(ctypes.c_int64)),
        ("placements", ctypes.POINTER(muon_placement_t)),
        ("replicated_mode", ctypes.c_int32),
        ("reserved1", ctypes.c_int32),
        # 0.7
        ("lr_scale", ctypes.c_double),
        ("weight_decay_scale", ctypes.c_double),
        ("split_dim", ctypes.c_int32),
        ("num_split_sizes", ctypes.c_int32),
        ("split_sizes", ctypes.POINTER(ctypes.c_int64)),
    ]


class muon_gathered_t(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),  # const float*
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
    ]


# The custom path's callbacks (muon_custom_layout_t). Float pointers are
# declared void* so that callbacks receive plain addresses (int or None).
CUSTOM_ASSIGN_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_char_p,
                                    ctypes.c_int32)
CUSTOM_GATHER_FN = ctypes.CFUNCTYPE(status_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.c_int32, ctypes.POINTER(muon_gathered_t),
                                    ctypes.c_void_p)
CUSTOM_REDISTRIBUTE_FN = ctypes.CFUNCTYPE(status_t, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_int64, ctypes.c_int64, ctypes.c_int32,
                                          ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)


class muon_custom_layout_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("state", ctypes.c_void_p),
        ("global_rows", ctypes.c_int64),
        ("global_cols", ctypes.c_int64),
        ("assign_fn", CUSTOM_ASSIGN_FN),
        ("gather_fn", CUSTOM_GATHER_FN),
        ("redistribute_fn", CUSTOM_REDISTRIBUTE_FN),
    ]


class muon_qk_clip_layer_t(ctypes.Structure):  # 0.7
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q_param", ctypes.c_int64),
        ("k_param", ctypes.c_int64),
        ("num_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("q_first_row", ctypes.c_int64),
        ("q_head_stride", ctypes.c_int64),
        ("q_head_rows", ctypes.c_int64),
        ("q_rotary_rows", ctypes.c_int64),
        ("k_first_row", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("k_head_rows", ctypes.c_int64),
        ("alpha", ctypes.c_double),
    ]


# muon_comm_t's collectives. Buffers are void* (plain addresses); the count
# and offset arrays are size_t*.
_size_p = ctypes.POINTER(ctypes.c_size_t)
COMM_ALL_GATHER_FN = ctypes.CFUNCTYPE(status_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_size_t, ctypes.c_void_p)
COMM_ALL_TO_ALL_V_FN = ctypes.CFUNCTYPE(status_t, ctypes.c_void_p, ctypes.c_void_p, _size_p,
                                        _size_p, ctypes.c_void_p, _size_p, _size_p,
                                        ctypes.c_void_p)
COMM_BROADCAST_FN = ctypes.CFUNCTYPE(status_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_int32, ctypes.c_void_p)
COMM_REDUCE_SCATTER_FN = ctypes.CFUNCTYPE(status_t, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32,
                                          ctypes.c_void_p)
COMM_BARRIER_FN = ctypes.CFUNCTYPE(status_t, ctypes.c_void_p, ctypes.c_void_p)
COMM_RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class muon_comm_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("ctx", ctypes.c_void_p),
        ("rank", ctypes.c_int32),
        ("size", ctypes.c_int32),
        ("all_gather", COMM_ALL_GATHER_FN),
        ("all_to_all_v", COMM_ALL_TO_ALL_V_FN),
        ("broadcast", COMM_BROADCAST_FN),
        ("reduce_scatter", COMM_REDUCE_SCATTER_FN),
        ("barrier", COMM_BARRIER_FN),
        ("release", COMM_RELEASE_FN),
    ]


class muon_stats_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("steps", ctypes.c_int64),
        ("bytes_sent", ctypes.c_int64),
        ("bytes_received", ctypes.c_int64),
        ("collectives", ctypes.c_int64),
        ("rounds", ctypes.c_int64),
        ("matrices_orthogonalized", ctypes.c_int64),
        ("ns_flops", ctypes.c_double),
        ("matrices_total", ctypes.c_int64),
        ("matrices_owned", ctypes.c_int64),
        ("nonfinite_grads", ctypes.c_int64),
        ("steps_skipped", ctypes.c_int64),
        ("memory_bytes", ctypes.c_int64),
        ("momentum_bytes", ctypes.c_int64),
        ("param_elements", ctypes.c_int64),
        ("bytes_per_param", ctypes.c_double),
    ]


class muon_optimizer(ctypes.Structure):
    """Incomplete C struct; only pointers to it are used."""


class muon_inprocess_world(ctypes.Structure):
    """Incomplete C struct; only pointers to it are used."""


opt_p = ctypes.POINTER(muon_optimizer)
world_p = ctypes.POINTER(muon_inprocess_world)

# name: (restype, argtypes), in the order of include/libmuon/muon.h.
_SIGNATURES = {
    "muon_status_string": (ctypes.c_char_p, [status_t]),
    "muon_last_error_message": (ctypes.c_char_p, []),
    "muon_get_version": (None, [ctypes.POINTER(ctypes.c_int32)] * 3),
    "muon_options_init": (status_t, [ctypes.POINTER(muon_options_t), ctypes.c_size_t]),
    "muon_sizeof_options": (ctypes.c_size_t, []),
    "muon_sizeof_param_options": (ctypes.c_size_t, []),
    "muon_sizeof_comm": (ctypes.c_size_t, []),
    "muon_sizeof_stats": (ctypes.c_size_t, []),
    "muon_sizeof_custom_layout": (ctypes.c_size_t, []),
    "muon_sizeof_gathered": (ctypes.c_size_t, []),
    "muon_sizeof_matrix_info": (ctypes.c_size_t, []),
    "muon_sizeof_placement": (ctypes.c_size_t, []),
    "muon_sizeof_qk_clip_layer": (ctypes.c_size_t, []),
    "muon_qk_clip_layer_init": (status_t, [ctypes.POINTER(muon_qk_clip_layer_t), ctypes.c_size_t]),
    "muon_register_qk_clip": (status_t, [opt_p, ctypes.POINTER(muon_qk_clip_layer_t),
                                         ctypes.POINTER(ctypes.c_int64)]),
    "muon_qk_clip": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_float),
                                ctypes.c_int32, ctypes.c_double, ctypes.POINTER(ctypes.c_int32)]),
    "muon_qk_clip_on_stream": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_float),
                                          ctypes.c_int32, ctypes.c_double, ctypes.c_void_p,
                                          ctypes.POINTER(ctypes.c_int32)]),
    "muon_create": (status_t, [ctypes.POINTER(muon_options_t), ctypes.POINTER(opt_p)]),
    "muon_destroy": (None, [opt_p]),
    "muon_get_options": (status_t, [opt_p, ctypes.POINTER(muon_options_t)]),
    "muon_set_lr": (status_t, [opt_p, ctypes.c_double]),
    "muon_set_weight_decay": (status_t, [opt_p, ctypes.c_double]),
    "muon_set_momentum": (status_t, [opt_p, ctypes.c_double]),
    "muon_push_hyperparameters": (status_t, [opt_p, ctypes.c_void_p]),
    "muon_param_options_init": (
        status_t, [ctypes.POINTER(muon_param_options_t), ctypes.c_size_t]),
    "muon_register_param": (
        status_t,
        [opt_p, ctypes.POINTER(DLTensor), ctypes.POINTER(DLTensor),
         ctypes.POINTER(muon_param_options_t), ctypes.POINTER(ctypes.c_int64)]),
    "muon_register_param_custom": (
        status_t,
        [opt_p, ctypes.POINTER(DLTensor), ctypes.POINTER(DLTensor),
         ctypes.POINTER(muon_param_options_t), ctypes.POINTER(muon_custom_layout_t),
         ctypes.POINTER(ctypes.c_int64)]),
    "muon_rebind_param": (
        status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(DLTensor), ctypes.POINTER(DLTensor)]),
    "muon_num_params": (status_t, [opt_p, ctypes.POINTER(ctypes.c_size_t)]),
    "muon_step": (status_t, [opt_p, ctypes.c_void_p]),
    "muon_step_count": (status_t, [opt_p, ctypes.POINTER(ctypes.c_int64)]),
    "muon_orthogonalize": (
        status_t,
        [opt_p, ctypes.POINTER(DLTensor), ctypes.POINTER(DLTensor), ctypes.c_int32,
         ctypes.c_void_p]),
    "muon_set_callback_error": (None, [ctypes.c_char_p]),
    "muon_set_world": (
        status_t, [opt_p, ctypes.POINTER(muon_comm_t), ctypes.POINTER(ctypes.c_int32)]),
    "muon_add_group": (
        status_t, [opt_p, ctypes.POINTER(muon_comm_t), ctypes.POINTER(ctypes.c_int32)]),
    "muon_stats_init": (status_t, [ctypes.POINTER(muon_stats_t), ctypes.c_size_t]),
    "muon_get_stats": (status_t, [opt_p, ctypes.POINTER(muon_stats_t)]),
    "muon_inprocess_world_create": (status_t, [ctypes.c_int32, ctypes.POINTER(world_p)]),
    "muon_inprocess_world_destroy": (None, [world_p]),
    "muon_inprocess_world_abort": (None, [world_p]),
    "muon_inprocess_comm": (
        status_t, [world_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_int32,
                   ctypes.POINTER(muon_comm_t)]),
    "muon_comm_from_nccl": (status_t, [ctypes.c_void_p, ctypes.POINTER(muon_comm_t)]),
    "muon_get_state_dtype": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(DLDataType)]),
    "muon_get_state": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(DLTensor)]),
    "muon_set_state": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(DLTensor)]),
    "muon_get_moments": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(DLTensor)]),
    "muon_set_moments": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(DLTensor)]),
    "muon_get_owned_moments": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(DLTensor),
                                          ctypes.POINTER(ctypes.c_uint8), ctypes.c_int64]),
    "muon_set_owned_moments": (status_t, [opt_p, ctypes.c_int64, ctypes.POINTER(DLTensor)]),
    "muon_save_state": (
        status_t, [opt_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "muon_load_state": (status_t, [opt_p, ctypes.c_void_p, ctypes.c_size_t]),
    "muon_load_states": (status_t, [opt_p, ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]),
}


def _candidates():
    """(description, path-or-name) pairs, in search order."""
    env = os.environ.get("MUON_LIBRARY")
    if env:
        yield "MUON_LIBRARY", env
        return  # an explicit choice is not second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    yield "next to the package", os.path.join(here, "libmuon.so")
    repo_root = os.path.dirname(os.path.dirname(here))  # python/muon
    yield "the repository's bazel-bin", os.path.join(repo_root, "bazel-bin", "libmuon.so")
    yield "the Bazel runfiles root", os.path.join(repo_root, "libmuon.so")
    found = ctypes.util.find_library("muon")
    if found:
        yield "the system loader", found
    yield "the system loader", "libmuon.so.1"


def _load():
    tried = []
    for where, path in _candidates():
        is_file_path = os.sep in path
        if is_file_path and not os.path.exists(path):
            tried.append("%s (%s): not found" % (path, where))
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s): %s" % (path, where, e))
    raise ImportError(
        "muon: cannot load libmuon.so. Build it with `bazel build //:libmuon.so` or set "
        "MUON_LIBRARY to its path. Tried:\n  " + "\n  ".join(tried))


def _declare(lib):
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError("muon: %s does not export %s; it does not match these bindings"
                              % (lib._name, name)) from None
        fn.restype = restype
        fn.argtypes = argtypes


def _mismatch(lib, struct, theirs):
    return ImportError(
        "muon: the ctypes mirror of %s has %d bytes but %s says %s; the bindings do not "
        "match this library build" % (struct.__name__, ctypes.sizeof(struct), lib._name, theirs))


def _check_struct_sizes(lib):
    for struct, fn in ((muon_options_t, lib.muon_sizeof_options),
                       (muon_param_options_t, lib.muon_sizeof_param_options),
                       (muon_comm_t, lib.muon_sizeof_comm),
                       (muon_stats_t, lib.muon_sizeof_stats),
                       (muon_custom_layout_t, lib.muon_sizeof_custom_layout),
                       (muon_gathered_t, lib.muon_sizeof_gathered),
                       (muon_matrix_info_t, lib.muon_sizeof_matrix_info),
                       (muon_placement_t, lib.muon_sizeof_placement),
                       (muon_qk_clip_layer_t, lib.muon_sizeof_qk_clip_layer)):
        theirs = fn()
        if ctypes.sizeof(struct) != theirs:
            raise _mismatch(lib, struct, theirs)


lib: ctypes.CDLL
path: str  # the file (or name) libmuon was loaded from: muon.library_path
lib, path = _load()
_declare(lib)
_check_struct_sizes(lib)
