// flash_kda._C: the Python binding of flashkda::forward and flashkda::decode (nanobind).
//
// The extension links no framework. Tensors are read one of two ways:
//   - torch.Tensor / nn.Parameter objects through their own attributes
//     (data_ptr(), shape, stride(), dtype, device): a few attribute reads each,
//     which is what keeps a small call's host time low (see TorchReader);
//   - anything else (CuPy, NumPy, JAX, torch subclasses, and torch tensors that
//     reader declines) through DLPack (nb::ndarray).
// Both give the same description of a tensor, and every tensor is checked here,
// before anything touches its memory, with errors that name the argument:
//   TypeError   not an array, or the wrong dtype (incl. states of different dtypes);
//   ValueError  rank / shape disagreement, non-C-contiguous strides, an
//               unsupported device, tensors on different devices, bad workspace;
// and then flashkda::forward validates the rest (lower_bound, alignment,
// cu_seqlens values on the host, ...). Its Status becomes
//   kInvalidArgument -> ValueError, kNotSupported -> NotImplementedError,
//   kCudaError / kInternal -> RuntimeError, with the C++ message verbatim.
//
// CUDA tensors run on Backend::kCuda on the stream passed as an integer
// (a cudaStream_t; 0 = the legacy default stream), CPU tensors on
// Backend::kCpuChunked (fwd) or the float64 CPU decode (decode: kCpuReference).
// Nothing is synchronised and no device memory is allocated here: fwd's scratch
// workspace comes from the caller (`workspace`), or from the `alloc(nbytes)`
// callable (python/flash_kda uses torch's caching allocator), and decode needs
// none, so a call can be captured in a CUDA graph. flashkda::decode validates
// its own rest (lower_bound, alignment, index values on the CPU, ...) the same way.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "api/forward_internal.h"
#include "flashkda/flashkda.h"

#ifdef FLASHKDA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Array = nb::ndarray<>;  // any dtype, any device, any shape: checked by hand below

constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAHost = 3;  // pinned host memory: readable by the CPU backends
constexpr size_t kWorkspaceAlign = 256;

template <typename... Ts>
std::string cat(const Ts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

[[noreturn]] void raise_type(const std::string& msg) { throw nb::type_error(msg.c_str()); }
[[noreturn]] void raise_value(const std::string& msg) { throw nb::value_error(msg.c_str()); }

[[noreturn]] void raise_status(const flashkda::Status& st) {
  PyObject* type = PyExc_RuntimeError;
  switch (st.code) {
    case flashkda::StatusCode::kInvalidArgument: type = PyExc_ValueError; break;
    case flashkda::StatusCode::kNotSupported: type = PyExc_NotImplementedError; break;
    default: type = PyExc_RuntimeError; break;
  }
  // Python's cu_seqlens is the core's cu_seqlens or cu_seqlens_int32 by its dtype:
  // the messages name the argument the caller passed.
  std::string message = st.message;
  static const std::string kInt32Name = "cu_seqlens_int32";
  for (size_t at = message.find(kInt32Name); at != std::string::npos; at = message.find(kInt32Name, at))
    message.replace(at, kInt32Name.size(), "cu_seqlens");
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

// ---- dtypes -----------------------------------------------------------------
enum class DT { kBF16, kF16, kF32, kF64, kI32, kI64, kU8, kBool, kOther };

DT dtype_of(const nb::dlpack::dtype& d) {
  if (d.lanes != 1) return DT::kOther;
  using C = nb::dlpack::dtype_code;
  if (d.code == uint8_t(C::Bfloat) && d.bits == 16) return DT::kBF16;
  if (d.code == uint8_t(C::Float) && d.bits == 16) return DT::kF16;
  if (d.code == uint8_t(C::Float) && d.bits == 32) return DT::kF32;
  if (d.code == uint8_t(C::Float) && d.bits == 64) return DT::kF64;
  if (d.code == uint8_t(C::Int) && d.bits == 32) return DT::kI32;
  if (d.code == uint8_t(C::Int) && d.bits == 64) return DT::kI64;
  if (d.code == uint8_t(C::UInt) && d.bits == 8) return DT::kU8;
  if (d.code == uint8_t(C::Bool) && d.bits == 8) return DT::kBool;
  return DT::kOther;
}

const char* name_of(DT t) {
  switch (t) {
    case DT::kBF16: return "bfloat16";
    case DT::kF16: return "float16";
    case DT::kF32: return "float32";
    case DT::kF64: return "float64";
    case DT::kI32: return "int32";
    case DT::kI64: return "int64";
    case DT::kU8: return "uint8";
    case DT::kBool: return "bool";
    default: return "?";
  }
}

std::string dtype_string(const nb::dlpack::dtype& d) {
  const DT t = dtype_of(d);
  if (t != DT::kOther) return name_of(t);
  static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const char* c = d.code < 7 ? codes[d.code] : "code?";
  return cat(c, int(d.bits), d.lanes != 1 ? cat("x", d.lanes) : std::string());
}

// ---- devices ----------------------------------------------------------------
struct Device {
  int32_t type = kDLCPU;  // kDLCPU or kDLCUDA (pinned host memory counts as CPU)
  int32_t id = 0;
  bool operator==(const Device& o) const { return type == o.type && (type != kDLCUDA || id == o.id); }
  std::string str() const { return type == kDLCUDA ? cat("cuda:", id) : std::string("cpu"); }
};

Device device_of(const char* name, const Array& a) {
  const int32_t t = a.device_type();
  if (t == kDLCPU || t == kDLCUDAHost) return {kDLCPU, 0};
  if (t == kDLCUDA) return {kDLCUDA, a.device_id()};
  raise_value(cat(name, ": expected a CPU or CUDA tensor, got DLPack device type ", t, " (id ", a.device_id(), ")"));
}

// ---- shapes -----------------------------------------------------------------
// Shape and strides (in elements) of one tensor. Every tensor of this API has
// rank <= 5, so they live inline (no allocation per argument); a higher rank only
// reaches an error message, and is kept on the heap for it.
class Dims {
 public:
  void resize(size_t n) {
    n_ = n;
    if (n > kInline) heap_.assign(2 * n, 0);
  }
  size_t size() const { return n_; }
  int64_t& shape(size_t i) { return n_ > kInline ? heap_[i] : inline_[i]; }
  int64_t& stride(size_t i) { return n_ > kInline ? heap_[n_ + i] : inline_[kInline + i]; }
  int64_t shape(size_t i) const { return const_cast<Dims*>(this)->shape(i); }
  int64_t stride(size_t i) const { return const_cast<Dims*>(this)->stride(i); }

 private:
  static constexpr size_t kInline = 6;
  size_t n_ = 0;
  int64_t inline_[2 * kInline] = {};
  std::vector<int64_t> heap_;
};

// ---- one tensor argument ----------------------------------------------------
// What the checks need of one tensor argument, from either reader below.
struct Arg {
  const char* name = "";
  bool present = false;
  void* ptr = nullptr;  // first element (null when absent)
  nb::dlpack::dtype dtype{};
  Device dev;
  Dims dims;
  Array arr;  // the DLPack import, held for the call (empty when read from torch directly)

  const void* cdata() const { return ptr; }
  void* data() const { return ptr; }
  size_t ndim() const { return dims.size(); }
  int64_t dim(size_t i) const { return dims.shape(i); }
  int64_t stride(size_t i) const { return dims.stride(i); }
};

std::string shape_string(const Arg& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.ndim(); ++i) s += cat(i ? ", " : "", a.dim(i));
  return s + "]";
}

std::string strides_string(const Arg& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.ndim(); ++i) s += cat(i ? ", " : "", a.stride(i));
  return s + "]";
}

// Dense row-major: stride of every dimension of extent > 1 equals the product of
// the extents to its right (the same rule as torch's is_contiguous()). With
// `first` > 0 only dimensions first.. are checked (a decode state pool: dense
// slots, any spacing between them).
bool c_contiguous(const Arg& a, size_t first = 0) {
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.dim(i) == 0) return true;  // no elements: any strides (as torch's is_contiguous)
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > first;) {
    const int64_t n = a.dim(i);
    if (n != 1 && a.stride(i) != expect) return false;
    expect *= n;
  }
  return true;
}

// ---- reader 1: torch tensors, through their own attributes ----------------------
// Exporting a torch tensor through DLPack costs microseconds each time (torch's
// __dlpack__ is Python code that builds a new DLManagedTensor, which nanobind then
// imports), and a forward call passes about ten of them: that was most of the host
// time of a small call. torch.Tensor and nn.Parameter objects are read here instead
// through data_ptr(), shape, stride(), dtype, is_cuda / is_cpu and get_device():
// the facts the DLPack export would carry, for a few attribute reads, and still
// without linking libtorch. Whatever this reader does not recognise (another class,
// a dtype or device outside its table, an attribute that raises, e.g. on a sparse
// tensor) goes through DLPack as before, so such arguments get the DLPack path's
// behaviour and error messages unchanged. requires_grad plays no part: the call
// is outside autograd either way (see import_dlpack).
class TorchReader {
 public:
  // Called once by flash_kda at import, when torch is installed. References are
  // kept for the life of the process (torch is never unloaded).
  void install(nb::handle torch) {
    tensor_type_ = nb::getattr(torch, "Tensor").inc_ref().ptr();
    parameter_type_ = nb::getattr(torch.attr("nn"), "Parameter").inc_ref().ptr();
    // (name, DLPack code, bits): what torch's DLPack export reports for each dtype,
    // so that a message like "expected dtype bfloat16, got complex64" is the same
    // on both paths.
    static const struct { const char* name; uint8_t code, bits; } table[] = {
        {"bool", 6, 8},       {"uint8", 1, 8},      {"int8", 0, 8},        {"int16", 0, 16},
        {"int32", 0, 32},     {"int64", 0, 64},     {"float16", 2, 16},    {"bfloat16", 4, 16},
        {"float32", 2, 32},   {"float64", 2, 64},   {"complex64", 5, 64},  {"complex128", 5, 128},
    };
    num_dtypes_ = 0;
    for (const auto& e : table) {
      nb::object d = nb::getattr(torch, e.name, nb::none());
      if (d.is_none()) continue;
      dtypes_[num_dtypes_++] = {d.inc_ref().ptr(), nb::dlpack::dtype{e.code, e.bits, 1}};
    }
    for (auto& [s, text] : {std::pair<PyObject**, const char*>{&s_data_ptr_, "data_ptr"}, {&s_shape_, "shape"},
                            {&s_stride_, "stride"}, {&s_dtype_, "dtype"}, {&s_is_cuda_, "is_cuda"},
                            {&s_is_cpu_, "is_cpu"}, {&s_get_device_, "get_device"}}) {
      *s = PyUnicode_InternFromString(text);
      if (*s == nullptr) throw nb::python_error();
    }
    installed_ = true;
  }

  bool enabled = true;  // off: every tensor goes through DLPack (tests, benchmarks)

  bool installed() const { return installed_; }

  // Fills a's pointer, dtype, device and dims from a torch tensor. Returns false,
  // with no Python error pending, when `obj` is not one this reader handles.
  bool read(nb::handle obj, Arg& a) const {
    if (!installed_ || !enabled) return false;
    PyObject* o = obj.ptr();
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
    // Exact classes only: a subclass may intercept attribute access (__torch_function__).
    if (type != tensor_type_ && type != parameter_type_) return false;
    const bool ok = read_attributes(o, a);
    if (!ok && PyErr_Occurred()) PyErr_Clear();
    return ok;
  }

 private:
  // 1 / 0 for a bool attribute, -1 on error.
  static int flag(PyObject* o, PyObject* name) {
    PyObject* v = PyObject_GetAttr(o, name);
    if (v == nullptr) return -1;
    const int r = v == Py_True ? 1 : 0;
    Py_DECREF(v);
    return r;
  }
  static PyObject* call(PyObject* o, PyObject* name) {
    return PyObject_VectorcallMethod(name, &o, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }
  // Reads a tuple of ints (torch.Size, stride()) into dims.shape or dims.stride.
  static bool read_ints(PyObject* tuple, Dims& dims, bool shape) {
    const Py_ssize_t n = PyTuple_Size(tuple);
    if (n < 0) return false;
    if (shape) dims.resize(static_cast<size_t>(n));
    else if (static_cast<size_t>(n) != dims.size()) return false;
    for (Py_ssize_t i = 0; i < n; ++i) {
      const long long v = PyLong_AsLongLong(PyTuple_GetItem(tuple, i));
      if (v == -1 && PyErr_Occurred()) return false;
      (shape ? dims.shape(size_t(i)) : dims.stride(size_t(i))) = v;
    }
    return true;
  }

  bool read_attributes(PyObject* o, Arg& a) const {
    PyObject* dt = PyObject_GetAttr(o, s_dtype_);
    if (dt == nullptr) return false;
    const DTypeEntry* entry = nullptr;
    for (int i = 0; i < num_dtypes_; ++i)
      if (dtypes_[i].obj == dt) entry = &dtypes_[i];
    Py_DECREF(dt);
    if (entry == nullptr) return false;
    a.dtype = entry->dtype;

    const int cuda = flag(o, s_is_cuda_);
    if (cuda < 0) return false;
    if (cuda) {
      PyObject* id = call(o, s_get_device_);
      if (id == nullptr) return false;
      const long v = PyLong_AsLong(id);
      Py_DECREF(id);
      if (v < 0) return false;
      a.dev = {kDLCUDA, static_cast<int32_t>(v)};
    } else {
      if (flag(o, s_is_cpu_) != 1) return false;  // meta, mps, xpu, ...: DLPack names the device
      a.dev = {kDLCPU, 0};
    }

    PyObject* shape = PyObject_GetAttr(o, s_shape_);
    if (shape == nullptr) return false;
    bool ok = read_ints(shape, a.dims, /*shape=*/true);
    Py_DECREF(shape);
    if (!ok) return false;
    PyObject* strides = call(o, s_stride_);
    if (strides == nullptr) return false;
    ok = read_ints(strides, a.dims, /*shape=*/false);
    Py_DECREF(strides);
    if (!ok) return false;

    PyObject* ptr = call(o, s_data_ptr_);
    if (ptr == nullptr) return false;
    a.ptr = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return !PyErr_Occurred();
  }

  struct DTypeEntry {
    PyObject* obj;
    nb::dlpack::dtype dtype;
  };
  bool installed_ = false;
  PyObject* tensor_type_ = nullptr;
  PyObject* parameter_type_ = nullptr;
  DTypeEntry dtypes_[16] = {};
  int num_dtypes_ = 0;
  PyObject *s_data_ptr_ = nullptr, *s_shape_ = nullptr, *s_stride_ = nullptr, *s_dtype_ = nullptr,
           *s_is_cuda_ = nullptr, *s_is_cpu_ = nullptr, *s_get_device_ = nullptr;
};

TorchReader g_torch;  // touched only with the GIL held

// ---- reader 2: any DLPack producer -----------------------------------------------
bool requires_grad(nb::handle obj) {
  PyObject* v = PyObject_GetAttrString(obj.ptr(), "requires_grad");
  if (v == nullptr) {
    PyErr_Clear();
    return false;
  }
  const int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  if (r < 0) PyErr_Clear();
  return r == 1;
}

// Why a tensor type that has __dlpack__ did not export (a torch tensor on the meta
// device, a read-only NumPy array): its own error, as " (its __dlpack__ failed:
// ...)"; empty for other objects.
std::string dlpack_refusal(nb::handle src) {
  if (!nb::hasattr(src, "__dlpack__")) return {};
  PyObject* r = PyObject_CallMethod(src.ptr(), "__dlpack__", nullptr);
  if (r != nullptr) {
    Py_DECREF(r);
    return {};
  }
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  std::string why;
  if (value != nullptr) why = nb::cast<std::string>(nb::str(nb::handle(value)));
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return why.empty() ? std::string() : cat(" (its __dlpack__ failed: ", why, ")");
}

// Imports `obj` through DLPack into a (pointer, dtype, dims; the device is read
// after the dtype check, see take()).
void import_dlpack(const char* name, nb::handle obj, Arg& a) {
  nb::object src = nb::borrow(obj);
  // torch's __dlpack__ refuses tensors that require grad, and fla passes
  // nn.Parameters (A_log, dt_bias). The kernels work outside autograd anyway, so the
  // detached view (the same storage: in-place writes land in the caller's tensor)
  // is what is read, as on the attribute path.
  if (requires_grad(obj)) src = src.attr("detach")();
  if (!nb::try_cast<Array>(src, a.arr, /*convert=*/false)) {
    // A tensor of a framework that names its device (torch's meta, mps, xpu...):
    // the right kind of argument in memory no backend reads, a ValueError as for
    // a tensor on the wrong device.
    if (nb::hasattr(src, "__dlpack__") && nb::hasattr(src, "device")) {
      const nb::object device = src.attr("device");
      const std::string where = nb::str(device).c_str();
      if (where.rfind("cpu", 0) != 0 && where.rfind("cuda", 0) != 0)
        raise_value(cat(name, ": expected a tensor in CPU or CUDA memory, got one on device ", where));
    }
    std::string tname = nb::cast<std::string>(nb::str(obj.type().attr("__name__")));
    raise_type(cat(name, ": expected a tensor supporting DLPack (torch.Tensor, CuPy or NumPy array), got ", tname,
                   dlpack_refusal(src)));
  }
  a.ptr = const_cast<void*>(a.arr.data());
  a.dtype = a.arr.dtype();
  a.dims.resize(a.arr.ndim());
  for (size_t i = 0; i < a.arr.ndim(); ++i) {
    a.dims.shape(i) = static_cast<int64_t>(a.arr.shape(i));
    a.dims.stride(i) = static_cast<int64_t>(a.arr.stride(i));
  }
}

// Converts `obj` (None allowed when `optional`) into an Arg with the dtype in
// `allowed`, on a CPU or CUDA device. `why`, when given, follows the expected
// dtypes in the message (what the dtype depends on).
Arg take(const char* name, nb::handle obj, std::initializer_list<DT> allowed, bool optional,
         const char* why = nullptr) {
  Arg a;
  a.name = name;
  if (obj.is_none()) {
    if (optional) return a;
    raise_type(cat(name, ": expected a tensor, got None"));
  }
  const bool from_torch = g_torch.read(obj, a);
  if (!from_torch) import_dlpack(name, obj, a);
  a.present = true;
  const DT t = dtype_of(a.dtype);
  bool ok = false;
  for (DT d : allowed) ok |= (d == t);
  if (!ok) {
    std::string want;
    size_t i = 0;
    for (DT d : allowed) want += cat(i++ ? " or " : "", name_of(d));
    raise_type(cat(name, ": expected dtype ", want, why ? why : "", ", got ", dtype_string(a.dtype)));
  }
  if (!from_torch) a.dev = device_of(name, a.arr);
  // Whether an optional argument was given is decided here, by None. flashkda reads a
  // null pointer as "not given" for some of them (cu_seqlens, has_initial_state, a
  // second pool, ...): a DLPack array with elements but no memory would silently be
  // run as that other call.
  bool empty = false;
  for (size_t i = 0; i < a.ndim(); ++i) empty |= a.dim(i) == 0;
  if (a.ptr == nullptr && !empty)
    raise_value(cat(name, ": null pointer for a tensor of shape ", shape_string(a),
                    " (only an empty tensor may have none)"));
  return a;
}

// An expected shape. Every tensor of this API has rank <= 5 (per_token_states as
// [N, t, HV, V, K]): fixed storage, so a check that passes allocates nothing.
struct Shape {
  int64_t d[5] = {};
  size_t n = 0;
  Shape(std::initializer_list<int64_t> dims) {
    for (int64_t x : dims) d[n++] = x;
  }
  Shape then(std::initializer_list<int64_t> tail) const {
    Shape s = *this;
    for (int64_t x : tail) s.d[s.n++] = x;
    return s;
  }
};

// Grouped value heads: v's heads (HV) a positive multiple of q's (H), named by the
// tensors the caller passed rather than by ForwardArgs' num_v_heads.
void expect_grouped_heads(const Arg& v, int64_t H, int64_t HV) {
  if (H > 0 && (HV < H || HV % H != 0))
    raise_value(cat("v: expected its heads (HV = ", HV, ") to be a positive multiple of q's heads (H = ", H,
                    "), got shape ", shape_string(v)));
}
// `what` names the expected shape in the message, e.g. "[B, T, H, K] (the shape of q)".
void expect_shape(const Arg& a, const Shape& want, const char* what) {
  bool ok = a.ndim() == want.n;
  for (size_t i = 0; ok && i < want.n; ++i) ok = a.dim(i) == want.d[i];
  if (!ok) {
    std::string dims = "[";
    for (size_t i = 0; i < want.n; ++i) dims += cat(i ? ", " : "", want.d[i]);
    raise_value(cat(a.name, ": expected shape ", what, " = ", dims, "], got ", shape_string(a)));
  }
}

void expect_contiguous(const Arg& a) {
  if (a.present && !c_contiguous(a))
    raise_value(cat(a.name, ": expected a C-contiguous (dense row-major) tensor, got shape ", shape_string(a),
                    " with strides ", strides_string(a), " (call .contiguous())"));
}

void expect_device(const Arg& a, const Arg& ref) {
  if (a.present && !(a.dev == ref.dev))
    raise_value(cat(a.name, ": expected a tensor on the same device as ", ref.name, " (", ref.dev.str(), "), got ",
                    a.dev.str()));
}

// A decode state pool [P, HV, V, K] with P >= 1 slots (P given: a second pool
// must match the first): each slot dense row-major, any spacing >= one slot
// between slots (e.g. a slice of a bigger buffer). Returns the slot stride in
// elements, 0 when it is one dense slot (or when P == 1 makes it irrelevant).
int64_t expect_pool(const Arg& a, int64_t P, int64_t HV, int64_t V, int64_t K) {
  if (a.ndim() != 4)
    raise_value(cat(a.name, ": expected a 4-d tensor [P, HV, V, K], got shape ", shape_string(a)));
  if (P < 0) {
    P = a.dim(0);
    expect_shape(a, {P, HV, V, K}, "[P, HV, V, K] (HV, V from v; K from q)");
  } else {
    expect_shape(a, {P, HV, V, K}, "[P, HV, V, K] (the shape of state_pool)");
  }
  if (P < 1) raise_value(cat(a.name, ": expected at least one slot, got shape ", shape_string(a)));
  if (!c_contiguous(a, 1))
    raise_value(cat(a.name, ": expected dense row-major slots (strides of the [HV, V, K] dims ", V * K, ", ", K,
                    ", 1; any stride between slots), got shape ", shape_string(a), " with strides ",
                    strides_string(a)));
  const int64_t per_slot = HV * V * K;
  if (P == 1 || per_slot == 0) return 0;
  const int64_t s = a.stride(0);
  if (s < per_slot)
    raise_value(cat(a.name, ": expected a stride between slots (stride(0)) of at least HV*V*K = ", per_slot,
                    " elements, got ", s, " (shape ", shape_string(a), ", strides ", strides_string(a), ")"));
  return s == per_slot ? 0 : s;
}

flashkda::DType state_dtype(const Arg& a) {
  if (!a.present) return flashkda::DType::kNone;
  return dtype_of(a.dtype) == DT::kF32 ? flashkda::DType::kFP32 : flashkda::DType::kBF16;
}

flashkda::Backend parse_backend(const std::string& s, const Device& dev) {
  if (s == "auto") return dev.type == kDLCUDA ? flashkda::Backend::kCuda : flashkda::Backend::kCpuChunked;
  flashkda::Backend b;
  if (s == "cuda") b = flashkda::Backend::kCuda;
  else if (s == "cpu") b = flashkda::Backend::kCpuChunked;
  else if (s == "reference") b = flashkda::Backend::kCpuReference;
  else raise_value(cat("backend: expected 'auto', 'cuda', 'cpu' or 'reference', got '", s, "'"));
  const bool cuda = b == flashkda::Backend::kCuda;
  if (cuda != (dev.type == kDLCUDA))
    raise_value(cat("backend: '", s, "' runs on ", cuda ? "CUDA" : "CPU", " tensors, got tensors on ", dev.str()));
  return b;
}

// ---- what g and beta hold ----------------------------------------------------
// fla's use_gate_in_kernel and use_beta_sigmoid_in_kernel. With the raw gate
// (FlashKDA's safe gate) g is bf16 and A_log, dt_bias are read; with the log
// decay (use_gate_in_kernel=False) g is bf16 or fp32 and A_log, dt_bias are not
// read, so not taken (None or a tensor alike, as fla ignores them). beta, the
// logit or b itself, is bf16 or fp32 either way.
constexpr const char* kRawGateDtypes = " (the raw gate; the log decay, use_gate_in_kernel=False, may be float32)";
constexpr const char* kLogDecayDtypes = " (the log decay, use_gate_in_kernel=False)";

Arg take_gate(nb::handle g, bool gate_in_kernel) {
  if (gate_in_kernel) return take("g", g, {DT::kBF16}, false, kRawGateDtypes);
  return take("g", g, {DT::kBF16, DT::kF32}, false, kLogDecayDtypes);
}

template <typename Args>
void set_gate_form(Args& a, const Arg& g, const Arg& beta, bool gate_in_kernel, bool beta_sigmoid_in_kernel) {
  a.gate_form = gate_in_kernel ? flashkda::GateForm::kSafeGate : flashkda::GateForm::kLogDecay;
  a.g_dtype = dtype_of(g.dtype) == DT::kF32 ? flashkda::DType::kFP32 : flashkda::DType::kBF16;
  a.beta_is_probability = !beta_sigmoid_in_kernel;
  a.beta_dtype = dtype_of(beta.dtype) == DT::kF32 ? flashkda::DType::kFP32 : flashkda::DType::kBF16;
}

// Everything of one call, checked, with the ForwardArgs filled in.
struct Call {
  Arg q, k, v, g, beta, out, A_log, dt_bias, s0, s1, cu, cu_host, pool, idx, has, ck, ck_off, ck_slot, sum_m, sum_b;
  flashkda::ForwardArgs args;
  flashkda::Backend backend = flashkda::Backend::kCpuChunked;
};

// The token and head strides of a token tensor that may be a strided view (e.g. of
// one fused projection output): `lead` leading dims flattened into the token axis
// (B·T, or decode's N·t), then the heads, then the width when `has_width` (beta has
// none). 0, 0 (the arguments' "dense") for a C-contiguous tensor; else the last
// dimension must be contiguous and the token axis evenly spaced. A dimension of
// extent 1 contributes nothing: 0 is passed for it. A stride of 0 elsewhere (a
// broadcast view from expand()) is refused: "dense" would read it past its memory.
void view_strides(const Arg& a, int lead, bool has_width, int64_t* token_stride, int64_t* head_stride) {
  *token_stride = *head_stride = 0;
  if (c_contiguous(a)) return;
  const size_t last = a.ndim() - 1;
  if (has_width && a.dim(last) > 1 && a.stride(last) != 1)
    raise_value(cat(a.name, ": expected the last dimension contiguous (stride 1), got shape ", shape_string(a),
                    " with strides ", strides_string(a), " (call .contiguous())"));
  const int64_t B_ = lead == 2 ? a.dim(0) : 1, T_ = a.dim(lead - 1), heads = a.dim(lead);
  const int64_t Bs = lead == 2 ? a.stride(0) : 0, Ts = a.stride(lead - 1);
  // The flattened token axis: the inner lead dim's stride, or the outer one's when
  // the inner has one token.
  const int64_t ts = T_ > 1 ? Ts : (B_ > 1 ? Bs : 0);
  const int64_t hs = heads > 1 ? a.stride(lead) : 0;
  if ((B_ > 1 && Bs == 0) || (T_ > 1 && Ts == 0) || (heads > 1 && hs == 0))
    raise_value(cat(a.name, ": expected non-zero strides along the batch, tokens and heads (a broadcast "
                    "view, e.g. from expand(), is not supported), got shape ", shape_string(a), " with strides ",
                    strides_string(a), " (call .contiguous())"));
  if (B_ > 1 && T_ > 1 && Bs != T_ * ts)
    raise_value(cat(a.name, ": expected evenly spaced tokens across the batch (stride(0) == T * stride(1)), "
                    "got shape ", shape_string(a), " with strides ", strides_string(a)));
  if (ts < 0 || hs < 0) raise_value(cat(a.name, ": expected non-negative strides, got ", strides_string(a)));
  *token_stride = ts;
  *head_stride = hs;
}

Call prepare(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, double scale, nb::handle out,
             nb::handle A_log, nb::handle dt_bias, double lower_bound, nb::handle initial_state,
             nb::handle final_state, nb::handle cu_seqlens, nb::handle cu_seqlens_host, nb::handle state_pool,
             nb::handle state_indices, nb::handle has_initial_state, nb::handle checkpoints,
             int64_t checkpoint_interval, bool checkpoints_value_major, nb::handle slot_checkpoint_offsets,
             nb::handle slot_checkpoint_slots, nb::handle summaries, bool resume_from_summaries,
             const std::string& backend, bool no_out = false, bool states_key_major = false,
             bool gate_in_kernel = true, bool beta_sigmoid_in_kernel = true) {
  Call c;
  // The summaries call of a split forward writes nothing but the summaries: out may be
  // None. segment_summaries has no out at all (no_out).
  const bool summaries_call = !summaries.is_none();
  // dtypes first (TypeError), in argument order.
  c.q = take("q", q, {DT::kBF16}, false);
  c.k = take("k", k, {DT::kBF16}, false);
  c.v = take("v", v, {DT::kBF16}, false);
  c.g = take_gate(g, gate_in_kernel);
  c.beta = take("beta", beta, {DT::kBF16, DT::kF32}, false);
  c.out = take("out", out, {DT::kBF16}, summaries_call || no_out);
  if (gate_in_kernel) {
    c.A_log = take("A_log", A_log, {DT::kF32}, false);
    c.dt_bias = take("dt_bias", dt_bias, {DT::kF32}, false);
  }
  c.s0 = take("initial_state", initial_state, {DT::kBF16, DT::kF32}, true);
  c.s1 = take("final_state", final_state, {DT::kBF16, DT::kF32}, true);
  // int64, or int32 (vLLM's offsets: ForwardArgs::cu_seqlens_int32).
  c.cu = take("cu_seqlens", cu_seqlens, {DT::kI64, DT::kI32}, true);
  c.cu_host = take("cu_seqlens_host", cu_seqlens_host, {DT::kI64}, true);
  c.pool = take("state_pool", state_pool, {DT::kBF16, DT::kF32}, true);
  c.idx = take("state_indices", state_indices, {DT::kI32, DT::kI64}, true);
  c.has = take("has_initial_state", has_initial_state, {DT::kBool, DT::kU8}, true);
  c.ck = take("checkpoints", checkpoints, {DT::kBF16, DT::kF32}, true);
  c.ck_off = take("slot_checkpoint_offsets", slot_checkpoint_offsets, {DT::kI64}, true);
  c.ck_slot = take("slot_checkpoint_slots", slot_checkpoint_slots, {DT::kI32, DT::kI64}, true);
  if (summaries_call) {
    const bool pair = nb::isinstance<nb::tuple>(summaries) || nb::isinstance<nb::list>(summaries);
    if (!pair || nb::len(summaries) != 2) {
      const std::string tname = nb::cast<std::string>(nb::str(summaries.type().attr("__name__")));
      raise_type(cat("summaries: expected a pair (M, B) of fp32 tensors [N, HV, K, K] and [N, HV, V, K], got ",
                     tname, pair ? cat(" of length ", nb::len(summaries)) : std::string()));
    }
    c.sum_m = take("summaries[0] (M)", nb::object(summaries[0]), {DT::kF32}, false);
    c.sum_b = take("summaries[1] (B)", nb::object(summaries[1]), {DT::kF32}, false);
  }
  if (c.s0.present && c.s1.present && dtype_of(c.s0.dtype) != dtype_of(c.s1.dtype))
    raise_type(cat("final_state: expected the same dtype as initial_state (", dtype_string(c.s0.dtype),
                   ") when both are given, got ", dtype_string(c.s1.dtype)));

  // Shapes (ValueError): q defines B, T, H, K; v defines HV, V.
  if (c.q.ndim() != 4) raise_value(cat("q: expected a 4-d tensor [B, T, H, K], got shape ", shape_string(c.q)));
  if (c.v.ndim() != 4)
    raise_value(cat("v: expected a 4-d tensor [B, T, HV, V], got shape ", shape_string(c.v)));
  const int64_t B = c.q.dim(0), T = c.q.dim(1), H = c.q.dim(2), K = c.q.dim(3);
  const int64_t HV = c.v.dim(2), V = c.v.dim(3);
  // Only T may be 0 (an empty call); the core's messages for the others name its
  // own fields (batch, num_heads, head_dim_k), not these tensors' dimensions.
  if (B < 1 || H < 1 || K < 1)
    raise_value(cat("q: expected B, H and K of at least 1 in [B, T, H, K], got shape ", shape_string(c.q)));
  if (HV < 1 || V < 1)
    raise_value(cat("v: expected HV and V of at least 1 in [B, T, HV, V], got shape ", shape_string(c.v)));
  expect_grouped_heads(c.v, H, HV);
  expect_shape(c.k, {B, T, H, K}, "[B, T, H, K] (the shape of q)");
  expect_shape(c.v, {B, T, HV, V}, "[B, T, HV, V] (B, T from q)");
  expect_shape(c.g, {B, T, HV, K}, "[B, T, HV, K] (HV from v, K from q)");
  expect_shape(c.beta, {B, T, HV}, "[B, T, HV] (HV from v)");
  if (c.out.present) expect_shape(c.out, {B, T, HV, V}, "[B, T, HV, V] (the shape of v)");
  if (gate_in_kernel) {
    expect_shape(c.A_log, {HV}, "[HV] (HV from v)");
    expect_shape(c.dt_bias, {HV, K}, "[HV, K] (HV from v, K from q)");
  }
  int64_t N = B;
  if (c.cu.present) {
    if (c.cu.ndim() != 1 || c.cu.dim(0) < 2)
      raise_value(cat("cu_seqlens: expected a 1-d tensor [N+1] with N >= 1, got shape ", shape_string(c.cu)));
    N = c.cu.dim(0) - 1;
    if (B != 1) raise_value(cat("cu_seqlens: requires B == 1 (flattened sequences), got q of shape ",
                                shape_string(c.q)));
  }
  if (c.cu_host.present) {
    if (!c.cu.present) raise_value("cu_seqlens_host: given without cu_seqlens");
    expect_shape(c.cu_host, {N + 1}, "[N+1] (the shape of cu_seqlens)");
  }
  // Where a count of sequences comes from, for the messages of the tensors that
  // must match it: a mismatch may be either side's fault, so both are named.
  const std::string n_from = c.cu.present ? "N = len(cu_seqlens) - 1" : "N = B, from q";
  auto per_seq = [&](const char* shape, const char* what) { return cat(shape, " (", what, n_from, ")"); };
  // [N, HV, K, V] with states_key_major (fla's layout).
  for (const Arg* s : {&c.s0, &c.s1})
    if (s->present) {
      if (states_key_major)
        expect_shape(*s, {N, HV, K, V}, per_seq("[N, HV, K, V] (states_key_major)", "HV, V from v; ").c_str());
      else expect_shape(*s, {N, HV, V, K}, per_seq("[N, HV, V, K]", "HV, V from v; ").c_str());
    }
  // A state pool: slots of [HV, V, K] at any stride (expect_pool), one index per sequence.
  int64_t pool_stride = 0;
  if (c.pool.present) {
    if (c.s0.present || c.s1.present)
      raise_value("state_pool: given together with initial_state / final_state (expected one or the other)");
    if (!c.idx.present) raise_value("state_indices: required with state_pool ([N] int32 or int64 slot per sequence)");
    pool_stride = expect_pool(c.pool, -1, HV, V, K);
  } else {
    if (c.idx.present) raise_value("state_indices: given without state_pool");
    if (c.has.present) raise_value("has_initial_state: given without state_pool");
  }
  if (c.idx.present) expect_shape(c.idx, {N}, per_seq("[N]", "one slot per sequence, ").c_str());
  if (c.ck_off.present || c.ck_slot.present) {
    if (!c.pool.present) raise_value("slot_checkpoint_offsets: slot checkpoints need a state_pool");
    if (!c.ck_off.present || !c.ck_slot.present)
      raise_value("slot_checkpoint_offsets: give both slot_checkpoint_offsets and slot_checkpoint_slots");
    expect_shape(c.ck_off, {N, 2}, per_seq("[N, 2]", "up to two offsets per sequence, ").c_str());
    expect_shape(c.ck_slot, {N, 2}, per_seq("[N, 2]", "the slot of each offset, ").c_str());
    if (dtype_of(c.ck_slot.dtype) != dtype_of(c.idx.dtype))
      raise_type(cat("slot_checkpoint_slots: expected the dtype of state_indices (", dtype_string(c.idx.dtype),
                     "), got ", dtype_string(c.ck_slot.dtype)));
  }
  // Checkpoints: any leading dims ([capacity] or [B, NT]), then one entry [HV, K, V]
  // (or [HV, V, K] value-major).
  int64_t ck_capacity = 0;
  if (c.ck.present) {
    const size_t r = c.ck.ndim();
    const int64_t d1 = checkpoints_value_major ? V : K, d2 = checkpoints_value_major ? K : V;
    if (r < 4 || c.ck.dim(r - 3) != HV || c.ck.dim(r - 2) != d1 || c.ck.dim(r - 1) != d2)
      raise_value(cat("checkpoints: expected a tensor [..., HV, ", checkpoints_value_major ? "V, K" : "K, V",
                      "] = [..., ", HV, ", ", d1, ", ", d2, "], got shape ", shape_string(c.ck)));
    ck_capacity = 1;
    for (size_t i = 0; i + 3 < r; ++i) ck_capacity *= c.ck.dim(i);
    // An empty buffer (its data pointer may be null) is capacity 0: the core checks
    // that the sequences need no entry where their lengths are on the host.
    if (checkpoint_interval <= 0)
      raise_value(cat("checkpoint_interval: expected a positive multiple of 16 with checkpoints, got ",
                      checkpoint_interval));
  }
  if (c.has.present) expect_shape(c.has, {N}, per_seq("[N]", "one flag per sequence, ").c_str());
  // The two calls of a split forward: (M, B) of each whole sequence, then the
  // resume. The combinations the summaries call excludes are named here by this
  // API's argument; flashkda::validate checks the rest (the resume call's).
  if (summaries_call) {
    expect_shape(c.sum_m, {N, HV, K, K}, per_seq("[N, HV, K, K]", "").c_str());
    expect_shape(c.sum_b, {N, HV, V, K}, per_seq("[N, HV, V, K]", "").c_str());
    if (resume_from_summaries)
      raise_value("summaries: given together with resume_from_summaries=True (the summaries call comes first; "
                  "the resume call takes no summaries)");
    if (c.s0.present || c.s1.present)
      raise_value("summaries: given together with initial_state / final_state (the summaries call reads and "
                  "writes no states; they belong to the resume call)");
    if (c.pool.present) raise_value("summaries: not supported together with state_pool");
    if (c.ck.present || c.ck_off.present)
      raise_value("summaries: not supported together with checkpoints or slot checkpoints");
  }

  // Strides (ValueError).
  for (const Arg* a : {&c.out, &c.A_log, &c.dt_bias, &c.s0, &c.s1, &c.cu, &c.cu_host, &c.idx, &c.has, &c.ck,
                       &c.ck_off, &c.ck_slot, &c.sum_m, &c.sum_b})
    expect_contiguous(*a);
  // q, k, v, g, beta may be strided views (e.g. of one fused projection): the last
  // dimension contiguous, and the flattened B·T token axis evenly spaced.
  int64_t token_stride[5] = {}, head_stride[5] = {};
  {
    const Arg* views[5] = {&c.q, &c.k, &c.v, &c.g, &c.beta};
    for (int i = 0; i < 5; ++i) view_strides(*views[i], 2, views[i]->ndim() == 4, &token_stride[i], &head_stride[i]);
  }

  // Devices (ValueError): everything where q is, except the host copy of cu_seqlens.
  for (const Arg* a : {&c.k, &c.v, &c.g, &c.beta, &c.out, &c.A_log, &c.dt_bias, &c.s0, &c.s1, &c.cu, &c.pool,
                       &c.idx, &c.has, &c.ck, &c.ck_off, &c.ck_slot, &c.sum_m, &c.sum_b})
    expect_device(*a, c.q);
  if (c.cu_host.present && c.cu_host.dev.type != kDLCPU)
    raise_value(cat("cu_seqlens_host: expected a CPU tensor, got ", c.cu_host.dev.str()));

  c.backend = parse_backend(backend, c.q.dev);

  flashkda::ForwardArgs& a = c.args;
  a.q = c.q.cdata(); a.k = c.k.cdata(); a.v = c.v.cdata(); a.g = c.g.cdata(); a.beta = c.beta.cdata();
  a.A_log = static_cast<const float*>(c.A_log.cdata());
  a.dt_bias = static_cast<const float*>(c.dt_bias.cdata());
  a.out = c.out.data();
  a.initial_state = c.s0.cdata(); a.initial_state_dtype = state_dtype(c.s0);
  a.final_state = c.s1.data();    a.final_state_dtype = state_dtype(c.s1);
  a.states_key_major = states_key_major;
  if (c.cu.present) {
    if (dtype_of(c.cu.dtype) == DT::kI32) a.cu_seqlens_int32 = static_cast<const int32_t*>(c.cu.cdata());
    else a.cu_seqlens = static_cast<const int64_t*>(c.cu.cdata());
    a.num_seqs = N;
    // For kCuda the device boundaries are never copied back (that would sync the
    // stream); only an explicitly given host copy is used (validated).
    a.cu_seqlens_host = static_cast<const int64_t*>(c.cu_host.cdata());
  }
  a.batch = B; a.seqlen = T; a.num_heads = H; a.num_v_heads = HV;
  a.head_dim_k = K; a.head_dim_v = V;
  a.q_token_stride = token_stride[0]; a.q_head_stride = head_stride[0];
  a.k_token_stride = token_stride[1]; a.k_head_stride = head_stride[1];
  a.v_token_stride = token_stride[2]; a.v_head_stride = head_stride[2];
  a.g_token_stride = token_stride[3]; a.g_head_stride = head_stride[3];
  a.beta_token_stride = token_stride[4]; a.beta_head_stride = head_stride[4];
  a.scale = static_cast<float>(scale);
  a.lower_bound = static_cast<float>(lower_bound);
  set_gate_form(a, c.g, c.beta, gate_in_kernel, beta_sigmoid_in_kernel);
  if (c.pool.present) {
    a.state_pool = c.pool.data();
    a.state_pool_dtype = state_dtype(c.pool);
    a.pool_size = c.pool.dim(0);
    a.pool_stride = pool_stride;
    a.state_indices = c.idx.cdata();
    a.state_index_type = dtype_of(c.idx.dtype) == DT::kI64 ? flashkda::IndexType::kInt64 : flashkda::IndexType::kInt32;
    a.has_initial_state = static_cast<const uint8_t*>(c.has.cdata());
    a.slot_checkpoint_offsets = static_cast<const int64_t*>(c.ck_off.cdata());
    a.slot_checkpoint_slots = c.ck_slot.cdata();
  }
  if (c.ck.present) {
    a.checkpoints = c.ck.data();
    a.checkpoints_dtype = state_dtype(c.ck);
    a.checkpoint_interval = checkpoint_interval;
    a.checkpoints_capacity = ck_capacity;
    a.checkpoints_value_major = checkpoints_value_major;
  }
  a.summaries_M = static_cast<float*>(c.sum_m.data());
  a.summaries_B = static_cast<float*>(c.sum_b.data());
  a.resume_from_summaries = resume_from_summaries;
  return c;
}

#ifdef FLASHKDA_WITH_CUDA
// Makes the tensors' device current for the call (the kernels launch on the
// current device), and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& d) {
    if (d.type != kDLCUDA) return;
    int cur = 0;
    if (cudaGetDevice(&cur) != cudaSuccess) { cudaGetLastError(); return; }
    if (cur != d.id && cudaSetDevice(d.id) == cudaSuccess) prev_ = cur;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};
#else
struct DeviceGuard {
  explicit DeviceGuard(const Device&) {}
};
#endif

size_t required_workspace(const Call& c) {
  size_t bytes = 0;
  DeviceGuard guard(c.q.dev);
  const flashkda::Status st = flashkda::workspace_size(c.args, c.backend, &bytes);
  if (!st.ok()) raise_status(st);
  return bytes;
}

size_t workspace_size_py(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, double scale,
                         nb::handle out, nb::handle A_log, nb::handle dt_bias, double lower_bound,
                         nb::handle initial_state, nb::handle final_state, nb::handle cu_seqlens,
                         nb::handle cu_seqlens_host, nb::handle state_pool, nb::handle state_indices,
                         nb::handle has_initial_state, nb::handle checkpoints, int64_t checkpoint_interval,
                         bool checkpoints_value_major, nb::handle slot_checkpoint_offsets,
                         nb::handle slot_checkpoint_slots, nb::handle summaries, bool resume_from_summaries,
                         const std::string& backend, bool states_key_major, bool use_gate_in_kernel,
                         bool use_beta_sigmoid_in_kernel) {
  Call c = prepare(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
                   cu_seqlens_host, state_pool, state_indices, has_initial_state, checkpoints, checkpoint_interval,
                   checkpoints_value_major, slot_checkpoint_offsets, slot_checkpoint_slots, summaries,
                   resume_from_summaries, backend, false, states_key_major, use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel);
  return required_workspace(c);
}

// Returns the workspace size that was needed (0 for the CPU backends).
size_t fwd_py(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, double scale, nb::handle out,
              nb::handle A_log, nb::handle dt_bias, double lower_bound, nb::handle initial_state,
              nb::handle final_state, nb::handle cu_seqlens, nb::handle cu_seqlens_host, nb::handle state_pool,
              nb::handle state_indices, nb::handle has_initial_state, nb::handle checkpoints,
              int64_t checkpoint_interval, bool checkpoints_value_major, nb::handle slot_checkpoint_offsets,
              nb::handle slot_checkpoint_slots, nb::handle summaries, bool resume_from_summaries,
              nb::handle workspace, nb::handle alloc, uintptr_t stream, const std::string& backend,
              bool states_key_major, bool use_gate_in_kernel, bool use_beta_sigmoid_in_kernel) {
  Call c = prepare(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
                   cu_seqlens_host, state_pool, state_indices, has_initial_state, checkpoints, checkpoint_interval,
                   checkpoints_value_major, slot_checkpoint_offsets, slot_checkpoint_slots, summaries,
                   resume_from_summaries, backend, false, states_key_major, use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel);
  const size_t need = required_workspace(c);  // validates c.args: forward_prevalidated below relies on it

  void* ws = nullptr;
  size_t ws_bytes = 0;
  nb::object allocated;  // keeps an alloc()ated workspace alive until the launch is queued
  // A call that needs no scratch (the CPU backends) still checks a workspace it
  // is given: the same argument on CUDA tensors would be refused.
  auto take_workspace = [&](const char* what, nb::handle src) {
    Arg w = take(what, src, {DT::kU8}, false);
    if (w.ndim() != 1) raise_value(cat(what, ": expected a 1-d uint8 tensor, got shape ", shape_string(w)));
    expect_contiguous(w);
    expect_device(w, c.q);
    return w;
  };
  if (need == 0 && !workspace.is_none()) take_workspace("workspace", workspace);
  if (need > 0) {
    nb::handle src = workspace;
    const char* what = "workspace";
    if (src.is_none()) {
      // The resume call reads what the summaries call left in the workspace: one
      // allocated per call would be gone (or reused) in between.
      if (c.args.summaries_M != nullptr || c.args.resume_from_summaries)
        raise_value(cat("workspace: the summaries call (summaries=) and its resume call (resume_from_summaries=True) "
                        "need ", need, " bytes of scratch memory on ", c.q.dev.str(), ": pass the same workspace= "
                        "(uint8, at least ", need + kWorkspaceAlign - 1, " bytes) to both, untouched in between"));
      if (alloc.is_none())
        raise_value(cat("workspace: this call needs ", need, " bytes of scratch memory on ", c.q.dev.str(),
                        "; pass workspace= (uint8, at least ", need + kWorkspaceAlign - 1,
                        " bytes) or alloc=callable(nbytes)"));
      allocated = alloc(need + kWorkspaceAlign - 1);
      src = allocated;
      what = "workspace (returned by alloc)";
    }
    const Arg w = take_workspace(what, src);
    // The backend wants a 256-byte aligned pointer: align inside the buffer.
    const uintptr_t p = reinterpret_cast<uintptr_t>(w.data());
    const size_t pad = (kWorkspaceAlign - p % kWorkspaceAlign) % kWorkspaceAlign;
    const size_t have = static_cast<size_t>(w.dim(0));
    if (w.data() == nullptr || have < need + pad)
      raise_value(cat(what, ": expected at least ", need + pad, " bytes (", need, " + ", pad,
                      " to reach 256-byte alignment; ", need + kWorkspaceAlign - 1, " always suffice), got ", have));
    ws = reinterpret_cast<void*>(p + pad);
    ws_bytes = have - pad;
  }

  flashkda::Status st;
  {
    nb::gil_scoped_release release;
    DeviceGuard guard(c.q.dev);
    st = flashkda::api::forward_prevalidated(c.args, c.backend, ws, ws_bytes, reinterpret_cast<void*>(stream));
  }
  if (!st.ok()) raise_status(st);
  return need;
}

// ---- decode ------------------------------------------------------------------
// Token tensors are rank 3 ([T, ...]) or rank 4 ([N, t, ...], read as the
// flattened [N*t, ...]); q decides which and every token tensor follows it.
struct DecodeCall {
  Arg q, k, v, g, beta, A_log, dt_bias, out, pool, idx, cu, cu_host, pool_out, per_tok, acc;
  flashkda::DecodeArgs args;
  flashkda::Backend backend = flashkda::Backend::kCpuReference;
};

DecodeCall prepare_decode(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, nb::handle A_log,
                          nb::handle dt_bias, nb::handle out, nb::handle state_pool, nb::handle state_indices,
                          double scale, double lower_bound, nb::handle cu_seqlens, nb::handle cu_seqlens_host,
                          nb::handle state_out_pool, nb::handle per_token_states, nb::handle num_accepted_tokens,
                          bool gate_in_kernel, bool beta_sigmoid_in_kernel) {
  DecodeCall c;
  // dtypes first (TypeError), in argument order.
  c.q = take("q", q, {DT::kBF16}, false);
  c.k = take("k", k, {DT::kBF16}, false);
  c.v = take("v", v, {DT::kBF16}, false);
  c.g = take_gate(g, gate_in_kernel);
  c.beta = take("beta", beta, {DT::kBF16, DT::kF32}, false);
  if (gate_in_kernel) {
    c.A_log = take("A_log", A_log, {DT::kF32}, false);
    c.dt_bias = take("dt_bias", dt_bias, {DT::kF32}, false);
  }
  c.out = take("out", out, {DT::kBF16}, false);
  c.pool = take("state_pool", state_pool, {DT::kF32, DT::kBF16}, false);
  c.idx = take("state_indices", state_indices, {DT::kI32, DT::kI64}, false);
  c.cu = take("cu_seqlens", cu_seqlens, {DT::kI64, DT::kI32}, true);
  c.cu_host = take("cu_seqlens_host", cu_seqlens_host, {DT::kI64}, true);
  c.pool_out = take("state_out_pool", state_out_pool, {DT::kF32, DT::kBF16}, true);
  c.per_tok = take("per_token_states", per_token_states, {DT::kF32, DT::kBF16}, true);
  c.acc = take("num_accepted_tokens", num_accepted_tokens, {DT::kI32, DT::kI64}, true);
  if (c.acc.present && dtype_of(c.acc.dtype) != dtype_of(c.idx.dtype))
    raise_type(cat("num_accepted_tokens: expected the dtype of state_indices (", dtype_string(c.idx.dtype), "), got ",
                   dtype_string(c.acc.dtype)));
  const DT sdt = dtype_of(c.pool.dtype);
  for (const Arg* a : {&c.pool_out, &c.per_tok})
    if (a->present && dtype_of(a->dtype) != sdt)
      raise_type(cat(a->name, ": expected the dtype of state_pool (", name_of(sdt), "), got ",
                     dtype_string(a->dtype)));

  // Shapes (ValueError): q defines the token layout, H and K; v defines HV and V.
  const size_t rank = c.q.ndim();
  if (rank != 3 && rank != 4)
    raise_value(cat("q: expected a 3-d tensor [T, H, K] or a 4-d tensor [N, t, H, K], got shape ",
                    shape_string(c.q)));
  const bool r3 = rank == 3;  // [T, ...]; else [N, t, ...]
  const Shape lead = r3 ? Shape{c.q.dim(0)} : Shape{c.q.dim(0), c.q.dim(1)};
  const int64_t H = c.q.dim(rank - 2), K = c.q.dim(rank - 1);
  const int64_t T = r3 ? lead.d[0] : lead.d[0] * lead.d[1];
  // As for the forward: the core's messages would name its own fields.
  if (H < 1 || K < 1)
    raise_value(cat("q: expected H and K of at least 1 in ", r3 ? "[T, H, K]" : "[N, t, H, K]", ", got shape ",
                    shape_string(c.q)));
  if (c.v.ndim() != rank)
    raise_value(cat("v: expected a ", rank, "-d tensor [", r3 ? "T" : "N, t", ", HV, V] (the rank of q), got shape ",
                    shape_string(c.v)));
  const int64_t HV = c.v.dim(rank - 2), V = c.v.dim(rank - 1);
  if (HV < 1 || V < 1)
    raise_value(cat("v: expected HV and V of at least 1 in ", r3 ? "[T, HV, V]" : "[N, t, HV, V]", ", got shape ",
                    shape_string(c.v)));
  expect_grouped_heads(c.v, H, HV);
  expect_shape(c.k, lead.then({H, K}), r3 ? "[T, H, K] (the shape of q)" : "[N, t, H, K] (the shape of q)");
  expect_shape(c.v, lead.then({HV, V}), r3 ? "[T, HV, V] (T from q)" : "[N, t, HV, V] (N, t from q)");
  expect_shape(c.g, lead.then({HV, K}),
               r3 ? "[T, HV, K] (HV from v, K from q)" : "[N, t, HV, K] (HV from v, K from q)");
  expect_shape(c.beta, lead.then({HV}), r3 ? "[T, HV] (HV from v)" : "[N, t, HV] (HV from v)");
  if (gate_in_kernel) {
    expect_shape(c.A_log, {HV}, "[HV] (HV from v)");
    expect_shape(c.dt_bias, {HV, K}, "[HV, K] (HV from v, K from q)");
  }
  expect_shape(c.out, lead.then({HV, V}), r3 ? "[T, HV, V] (the shape of v)" : "[N, t, HV, V] (the shape of v)");
  const int64_t pool_stride = expect_pool(c.pool, -1, HV, V, K);
  const int64_t P = c.pool.dim(0);
  const int64_t out_stride = c.pool_out.present ? expect_pool(c.pool_out, P, HV, V, K) : 0;
  // [N], or [N, 1 + draft tokens] for speculative verify on pool slots.
  if (c.idx.ndim() != 1 && c.idx.ndim() != 2)
    raise_value(cat("state_indices: expected a tensor [N] (or [N, 1 + draft tokens] for speculative verify), got "
                    "shape ", shape_string(c.idx)));
  const int64_t N = c.idx.dim(0);
  // [N, 0] has no slot to read for each of its N sequences (it would be read as [N]).
  if (c.idx.ndim() == 2 && c.idx.dim(1) < 1)
    raise_value(cat("state_indices: expected [N] or [N, 1 + draft tokens] with at least one column, got shape ",
                    shape_string(c.idx)));
  const int64_t verify_slots = c.idx.ndim() == 2 ? c.idx.dim(1) : 0;
  if (c.acc.present) {
    if (verify_slots == 0)
      raise_value("num_accepted_tokens: needs 2-d state_indices [N, 1 + draft tokens]");
    expect_shape(c.acc, {N}, "[N] (one count per sequence, N = len(state_indices))");
  }
  int64_t tokens_per_seq = 1;
  if (c.cu.present) {
    expect_shape(c.cu, {N + 1}, "[N+1] (N = len(state_indices))");
  } else if (N == 0) {
    if (T != 0) raise_value(cat("q: expected no tokens with an empty state_indices, got shape ", shape_string(c.q)));
  } else {
    // [N, t, ...] names the sequences by its first dim: another count there would
    // cut the flattened tokens into other sequences than the caller's rows (fla
    // reads [1, t] without cu_seqlens as one sequence of t tokens).
    if (!r3 && lead.d[0] != N)
      raise_value(cat("q: expected [N, t, H, K] with N = len(state_indices) = ", N,
                      " sequences without cu_seqlens (one row a sequence), got shape ", shape_string(c.q)));
    if (T == 0 || T % N != 0)
      raise_value(cat("q: expected a token count T = ", T, " that is a positive multiple of N = len(state_indices) = ",
                      N, " (t = T / N tokens per sequence; pass cu_seqlens for uneven counts), got shape ",
                      shape_string(c.q)));
    tokens_per_seq = T / N;
  }
  if (c.cu_host.present) {
    if (!c.cu.present) raise_value("cu_seqlens_host: given without cu_seqlens");
    expect_shape(c.cu_host, {N + 1}, "[N+1] (the shape of cu_seqlens)");
  }
  if (c.per_tok.present)
    expect_shape(c.per_tok, lead.then({HV, V, K}), r3 ? "[T, HV, V, K]" : "[N, t, HV, V, K]");

  // Strides (ValueError); the pools were checked above. q, k, v, g, beta may be
  // strided views (e.g. of one fused projection), as for the forward.
  for (const Arg* a : {&c.A_log, &c.dt_bias, &c.out, &c.idx, &c.cu, &c.cu_host, &c.per_tok, &c.acc})
    expect_contiguous(*a);
  int64_t token_stride[5] = {}, head_stride[5] = {};
  {
    const Arg* views[5] = {&c.q, &c.k, &c.v, &c.g, &c.beta};
    const int lead = r3 ? 1 : 2;
    for (int i = 0; i < 5; ++i)
      view_strides(*views[i], lead, views[i]->ndim() == static_cast<size_t>(lead) + 2, &token_stride[i],
                   &head_stride[i]);
  }

  // Devices (ValueError): everything where q is, except the host copy of cu_seqlens.
  for (const Arg* a : {&c.k, &c.v, &c.g, &c.beta, &c.A_log, &c.dt_bias, &c.out, &c.pool, &c.idx, &c.cu,
                       &c.pool_out, &c.per_tok, &c.acc})
    expect_device(*a, c.q);
  if (c.cu_host.present && c.cu_host.dev.type != kDLCPU)
    raise_value(cat("cu_seqlens_host: expected a CPU tensor, got ", c.cu_host.dev.str()));

  // The CPU decode is the float64 recurrence (kCpuReference); CUDA tensors run kCuda.
  c.backend = c.q.dev.type == kDLCUDA ? flashkda::Backend::kCuda : flashkda::Backend::kCpuReference;

  flashkda::DecodeArgs& a = c.args;
  a.q = c.q.cdata(); a.k = c.k.cdata(); a.v = c.v.cdata(); a.g = c.g.cdata(); a.beta = c.beta.cdata();
  a.q_token_stride = token_stride[0]; a.q_head_stride = head_stride[0];
  a.k_token_stride = token_stride[1]; a.k_head_stride = head_stride[1];
  a.v_token_stride = token_stride[2]; a.v_head_stride = head_stride[2];
  a.g_token_stride = token_stride[3]; a.g_head_stride = head_stride[3];
  a.beta_token_stride = token_stride[4]; a.beta_head_stride = head_stride[4];
  a.A_log = static_cast<const float*>(c.A_log.cdata());
  a.dt_bias = static_cast<const float*>(c.dt_bias.cdata());
  a.out = c.out.data();
  a.num_seqs = N;
  a.tokens_per_seq = tokens_per_seq;
  if (c.cu.present && dtype_of(c.cu.dtype) == DT::kI32) a.cu_seqlens_int32 = static_cast<const int32_t*>(c.cu.cdata());
  else a.cu_seqlens = static_cast<const int64_t*>(c.cu.cdata());
  a.cu_seqlens_host = static_cast<const int64_t*>(c.cu_host.cdata());
  a.total_tokens = T;
  a.state_pool = c.pool.data();
  a.state_dtype = state_dtype(c.pool);
  a.pool_size = P;
  a.pool_stride = pool_stride;
  a.state_out_pool = c.pool_out.data();
  // 0 would mean "pool_stride": give the out pool's own spacing (one dense slot when 0).
  a.state_out_stride = c.pool_out.present ? (out_stride != 0 ? out_stride : HV * V * K) : 0;
  a.state_indices = c.idx.cdata();
  a.index_type = dtype_of(c.idx.dtype) == DT::kI64 ? flashkda::IndexType::kInt64 : flashkda::IndexType::kInt32;
  a.verify_slots = verify_slots;
  a.num_accepted_tokens = c.acc.cdata();
  a.per_token_states = c.per_tok.data();
  a.num_heads = H; a.num_v_heads = HV;
  a.head_dim_k = K; a.head_dim_v = V;
  a.scale = static_cast<float>(scale);
  a.lower_bound = static_cast<float>(lower_bound);
  set_gate_form(a, c.g, c.beta, gate_in_kernel, beta_sigmoid_in_kernel);
  return c;
}

void decode_py(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, nb::handle A_log,
               nb::handle dt_bias, nb::handle out, nb::handle state_pool, nb::handle state_indices, double scale,
               double lower_bound, nb::handle cu_seqlens, nb::handle cu_seqlens_host, nb::handle state_out_pool,
               nb::handle per_token_states, nb::handle num_accepted_tokens, uintptr_t stream, int32_t pdl_mode,
               bool use_gate_in_kernel, bool use_beta_sigmoid_in_kernel) {
  DecodeCall c = prepare_decode(q, k, v, g, beta, A_log, dt_bias, out, state_pool, state_indices, scale, lower_bound,
                                cu_seqlens, cu_seqlens_host, state_out_pool, per_token_states, num_accepted_tokens,
                                use_gate_in_kernel, use_beta_sigmoid_in_kernel);
  // An int (not a bool) so auto can be told from off; flashkda::decode rejects values outside {-1, 0, 1}.
  c.args.programmatic_dependent_launch = static_cast<flashkda::PdlMode>(pdl_mode);
  flashkda::Status st;
  {
    nb::gil_scoped_release release;
    DeviceGuard guard(c.q.dev);
    st = flashkda::decode(c.args, c.backend, reinterpret_cast<void*>(stream));
  }
  if (!st.ok()) raise_status(st);
}

// ---- segment summaries ----------------------------------------------------------
// The token tensors are checked as fwd checks them (v stands in for `out`, which
// the summaries do not write; no states); segments int64 [S, 2], M fp32
// [S, HV, K, K] and B fp32 [S, HV, V, K] on the same device, written in place.
void segment_summaries_py(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta,
                          nb::handle A_log, nb::handle dt_bias, double lower_bound, nb::handle cu_seqlens,
                          nb::handle segments, nb::handle M, nb::handle B, const std::string& backend,
                          bool use_gate_in_kernel, bool use_beta_sigmoid_in_kernel) {
  Call c = prepare(q, k, v, g, beta, 1.0, nb::none(), A_log, dt_bias, lower_bound, nb::none(), nb::none(),
                   cu_seqlens, nb::none(), nb::none(), nb::none(), nb::none(), nb::none(), 0, false, nb::none(),
                   nb::none(), nb::none(), false, backend, /*no_out=*/true, /*states_key_major=*/false,
                   use_gate_in_kernel, use_beta_sigmoid_in_kernel);
  Arg seg = take("segments", segments, {DT::kI64}, false);
  Arg m = take("M", M, {DT::kF32}, false);
  Arg b = take("B", B, {DT::kF32}, false);
  if (seg.ndim() != 2 || seg.dim(1) != 2)
    raise_value(cat("segments: expected an int64 tensor [S, 2] of (begin, end) token pairs, got shape ",
                    shape_string(seg)));
  const int64_t S = seg.dim(0), HV = c.args.num_v_heads, K = c.args.head_dim_k, V = c.args.head_dim_v;
  expect_shape(m, {S, HV, K, K}, "[S, HV, K, K]");
  expect_shape(b, {S, HV, V, K}, "[S, HV, V, K]");
  for (const Arg* a : {&seg, &m, &b}) {
    expect_contiguous(*a);
    expect_device(*a, c.q);
  }
  flashkda::SegmentSummaryArgs a;
  a.inputs = c.args;
  a.segments = static_cast<const int64_t*>(seg.cdata());
  a.num_segments = S;
  a.M = static_cast<float*>(m.data());
  a.B = static_cast<float*>(b.data());
  flashkda::Status st;
  {
    nb::gil_scoped_release release;
    st = flashkda::segment_summaries(a, c.backend);
  }
  if (!st.ok()) raise_status(st);
}

// (M, B) = (M1, B1)∘(M2, B2) over any leading dims: M* fp32 [..., K, K], B* fp32
// [..., V, K], all with the same leading dims; M, B may be M1/B1 or M2/B2.
void compose_summaries_py(nb::handle M1, nb::handle B1, nb::handle M2, nb::handle B2, nb::handle M, nb::handle B,
                          uintptr_t stream, const std::string& backend) {
  Arg m1 = take("M1", M1, {DT::kF32}, false), b1 = take("B1", B1, {DT::kF32}, false);
  Arg m2 = take("M2", M2, {DT::kF32}, false), b2 = take("B2", B2, {DT::kF32}, false);
  Arg m = take("M", M, {DT::kF32}, false), b = take("B", B, {DT::kF32}, false);
  if (m1.ndim() < 2 || m1.ndim() > 5 || m1.dim(m1.ndim() - 1) != m1.dim(m1.ndim() - 2))
    raise_value(cat("M1: expected a tensor [..., K, K] with at most 3 leading dims, got shape ", shape_string(m1)));
  const size_t lead = m1.ndim() - 2;
  const int64_t K = m1.dim(lead);
  if (b1.ndim() != m1.ndim() || b1.dim(lead + 1) != K)
    raise_value(cat("B1: expected a tensor [..., V, K] with the leading dims of M1 and K=", K, ", got shape ",
                    shape_string(b1)));
  const int64_t V = b1.dim(lead);
  Shape leading({});
  int64_t count = 1;
  for (size_t i = 0; i < lead; ++i) {
    leading = leading.then({m1.dim(i)});
    count *= m1.dim(i);
  }
  const Shape mshape = leading.then({K, K}), bshape = leading.then({V, K});
  for (const Arg* a : {&m2, &m}) expect_shape(*a, mshape, "[..., K, K] (the shape of M1)");
  for (const Arg* a : {&b2, &b}) expect_shape(*a, bshape, "[..., V, K] (the shape of B1)");
  for (const Arg* a : {&m1, &b1, &m2, &b2, &m, &b}) {
    expect_contiguous(*a);
    expect_device(*a, m1);
  }
  flashkda::ComposeSummariesArgs a;
  a.count = count;
  a.head_dim_k = K;
  a.head_dim_v = V;
  a.M1 = static_cast<const float*>(m1.cdata());
  a.B1 = static_cast<const float*>(b1.cdata());
  a.M2 = static_cast<const float*>(m2.cdata());
  a.B2 = static_cast<const float*>(b2.cdata());
  a.M = static_cast<float*>(m.data());
  a.B = static_cast<float*>(b.data());
  a.stream = reinterpret_cast<void*>(stream);
  const flashkda::Backend be = parse_backend(backend, m1.dev);
  flashkda::Status st;
  {
    nb::gil_scoped_release release;
    st = flashkda::compose_summaries(a, be);
  }
  if (!st.ok()) raise_status(st);
}

nb::tuple cuda_status() {
  std::string why;
  const bool ok = flashkda::cuda_backend_available(&why);
  return nb::make_tuple(ok, why);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flash-kda: Kimi Delta Attention forward and decode (C++/CUDA), DLPack binding";

  // .none(): a None tensor reaches take(), which names the argument in its TypeError.
  m.def("fwd", &fwd_py, "q"_a.none(), "k"_a.none(), "v"_a.none(), "g"_a.none(), "beta"_a.none(), "scale"_a,
        "out"_a.none(), "A_log"_a.none(), "dt_bias"_a.none(), "lower_bound"_a, "initial_state"_a = nb::none(), "final_state"_a = nb::none(),
        "cu_seqlens"_a = nb::none(), "cu_seqlens_host"_a = nb::none(), "state_pool"_a = nb::none(),
        "state_indices"_a = nb::none(), "has_initial_state"_a = nb::none(), "checkpoints"_a = nb::none(),
        "checkpoint_interval"_a = 0, "checkpoints_value_major"_a = false, "slot_checkpoint_offsets"_a = nb::none(),
        "slot_checkpoint_slots"_a = nb::none(), "summaries"_a = nb::none(), "resume_from_summaries"_a = false,
        "workspace"_a = nb::none(),
        "alloc"_a = nb::none(), "stream"_a = 0, "backend"_a = "auto", "states_key_major"_a = false,
        "use_gate_in_kernel"_a = true, "use_beta_sigmoid_in_kernel"_a = true,
        "Runs the KDA forward into `out` (and `final_state`), in place. Tensors: see flash_kda.fwd. "
        "`workspace`: uint8 scratch on the tensors' device, or `alloc(nbytes)` returning one. "
        "`stream`: cudaStream_t as an int (CUDA tensors). `backend`: 'auto' (CUDA tensors -> 'cuda', "
        "CPU tensors -> 'cpu'), 'cuda', 'cpu' (chunked fp32) or 'reference' (float64 oracle). "
        "`summaries`: None or a pair (M, B) (the summaries call of a split forward; `out` may then be None); "
        "`resume_from_summaries`: the second call. `states_key_major`: initial_state / final_state are "
        "[N, HV, K, V]. `use_gate_in_kernel`: g is the raw gate (True) or the log decay, bf16 or fp32 (False: "
        "A_log, dt_bias and lower_bound are not read); `use_beta_sigmoid_in_kernel`: beta is the logit (True) or "
        "b itself (False). Returns the workspace bytes the call needed.");
  m.def("workspace_size", &workspace_size_py, "q"_a.none(), "k"_a.none(), "v"_a.none(), "g"_a.none(),
        "beta"_a.none(), "scale"_a, "out"_a.none(), "A_log"_a.none(), "dt_bias"_a.none(), "lower_bound"_a, "initial_state"_a = nb::none(), "final_state"_a = nb::none(),
        "cu_seqlens"_a = nb::none(), "cu_seqlens_host"_a = nb::none(), "state_pool"_a = nb::none(),
        "state_indices"_a = nb::none(), "has_initial_state"_a = nb::none(), "checkpoints"_a = nb::none(),
        "checkpoint_interval"_a = 0, "checkpoints_value_major"_a = false, "slot_checkpoint_offsets"_a = nb::none(),
        "slot_checkpoint_slots"_a = nb::none(), "summaries"_a = nb::none(), "resume_from_summaries"_a = false,
        "backend"_a = "auto", "states_key_major"_a = false, "use_gate_in_kernel"_a = true,
        "use_beta_sigmoid_in_kernel"_a = true,
        "Bytes of scratch memory fwd needs for these arguments (0 on the CPU backends). "
        "Checks the arguments exactly as fwd does.");
  m.def("decode", &decode_py, "q"_a.none(), "k"_a.none(), "v"_a.none(), "g"_a.none(), "beta"_a.none(),
        "A_log"_a.none(), "dt_bias"_a.none(), "out"_a.none(), "state_pool"_a.none(), "state_indices"_a.none(),
        "scale"_a, "lower_bound"_a, "cu_seqlens"_a = nb::none(), "cu_seqlens_host"_a = nb::none(),
        "state_out_pool"_a = nb::none(), "per_token_states"_a = nb::none(), "num_accepted_tokens"_a = nb::none(),
        "stream"_a = 0, "pdl_mode"_a = 0, "use_gate_in_kernel"_a = true, "use_beta_sigmoid_in_kernel"_a = true,
        "One decode step: each sequence n's new tokens run the recurrence on slot state_indices[n] of "
        "state_pool (in place, or into state_out_pool), writing `out` in place. Tensors: see flash_kda.decode. "
        "CPU tensors run the float64 CPU decode, CUDA tensors the kCuda kernel on `stream` "
        "(cudaStream_t as an int). `pdl_mode`: programmatic dependent launch of that kernel, "
        "0 auto, 1 on, -1 off (flash_kda.decode's pdl=None/True/False). `use_gate_in_kernel`, "
        "`use_beta_sigmoid_in_kernel`: what g and beta hold, as for fwd.");
  m.def("segment_summaries", &segment_summaries_py, "q"_a.none(), "k"_a.none(), "v"_a.none(), "g"_a.none(),
        "beta"_a.none(), "A_log"_a.none(), "dt_bias"_a.none(), "lower_bound"_a, "cu_seqlens"_a.none(),
        "segments"_a.none(), "M"_a.none(), "B"_a.none(), "backend"_a = "auto", "use_gate_in_kernel"_a = true,
        "use_beta_sigmoid_in_kernel"_a = true,
        "Writes the affine summaries (M [S, HV, K, K], B [S, HV, V, K]) of the token ranges in `segments` "
        "(int64 [S, 2]) in place: see flash_kda.segment_summaries.");
  m.def("compose_summaries", &compose_summaries_py, "M1"_a.none(), "B1"_a.none(), "M2"_a.none(), "B2"_a.none(),
        "M"_a.none(), "B"_a.none(), "stream"_a = 0, "backend"_a = "auto",
        "(M, B) = (M1, B1) o (M2, B2), in place into M, B: see flash_kda.compose_summaries. "
        "`stream`: cudaStream_t as an int (CUDA tensors).");
  m.def(
      "check_device_faults",
      [](int device, uintptr_t stream) {
        Device d;
        d.type = device >= 0 ? kDLCUDA : kDLCPU;
        d.id = device;
        DeviceGuard guard(d);
        const flashkda::Status st = flashkda::check_device_faults(reinterpret_cast<void*>(stream));
        if (!st.ok()) raise_status(st);
      },
      "device"_a, "stream"_a,
      "Waits for `stream` on CUDA device `device` (-1: the current one), then reads and clears the record of "
      "invalid device-resident argument values (cu_seqlens values, decode's state_indices) met by the kernels "
      "there since the last check: ValueError naming the argument when there was one (flashkda::check_device_faults).");
  m.def("cuda_status", &cuda_status,
        "(available, reason): whether the CUDA backend can run in this process, and why not.");
  m.def("cuda_available", []() { return flashkda::cuda_backend_available(nullptr); },
        "Whether the CUDA backend can run here: kernels compiled in and a compute-capability-9.0 device present.");
#ifdef FLASHKDA_WITH_CUDA
  m.attr("compiled_with_cuda") = true;
#else
  m.attr("compiled_with_cuda") = false;
#endif
  m.attr("workspace_alignment") = kWorkspaceAlign;

  m.def("register_torch", [](nb::handle torch) { g_torch.install(torch); }, "torch"_a,
        "Lets the binding read torch.Tensor / nn.Parameter arguments through their attributes instead of "
        "DLPack (flash_kda calls it at import when torch is installed).");
  m.def("set_torch_fast_path",
        [](bool enabled) {
          const bool previous = g_torch.enabled;
          g_torch.enabled = enabled;
          return previous;
        },
        "enabled"_a,
        "Turns the torch attribute reader on or off (off: torch tensors go through DLPack too, as any other "
        "array). Returns the previous setting. For tests and benchmarks.");
  m.def("torch_fast_path", []() { return g_torch.installed() && g_torch.enabled; },
        "Whether torch tensors are read through their attributes (registered and enabled).");
}
