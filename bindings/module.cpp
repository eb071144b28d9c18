// module.cpp -- the extension module pcops._C. Importing it loads the library, whose static
// initialisers register the ops (bindings/registry.cpp and bindings/<op>.cpp). Only Python's
// limited API is used (no pybind), so one build serves every Python version from 3.10 on.
//
// The module has one function, _wrap_op, which pcops/_loader.py uses to put a call hook
// (OpCall) in front of each op's Python entry point (the `_op` callable of its OpOverload and
// OpOverloadPacket). The hook does two things the stable ABI cannot do from C++:
//   * Exceptions: the stable ABI carries std::runtime_error only, which torch raises as
//     RuntimeError. A binding that means ValueError, TypeError or torch.OutOfMemoryError starts
//     its message with "ValueError: ", "TypeError: " or "OutOfMemoryError: " (bindings/utils.cpp,
//     raise); the hook re-raises those as that exception with the rest of the message. Other
//     exceptions pass unchanged.
//   * Settings of torch that the stable ABI cannot read: the hook reads them in Python and hands
//     them to the binding for the call (utils.h, CallState): torch.use_deterministic_algorithms
//     with fill_uninitialized_memory (then outputs come from torch's empty, which fills them),
//     and, for the ops that synchronise with the host, torch.cuda.set_sync_debug_mode (then the
//     binding raises, or lets torch warn, as torch's own synchronising calls do).
// The hook is C, so it adds well under a microsecond to a call; calls that do not come from
// Python (AOTInductor, C++) skip it and see the RuntimeError with the prefix.
#include <Python.h>
#include <structmember.h>

#include <string.h>

#include "utils.h"

namespace {

struct OpCall {
    PyObject_HEAD
    PyObject* op;        // the callable torch made for the op
    PyObject* get_mode;  // torch._C._cuda_get_sync_debug_mode for ops that synchronise, or NULL
    PyObject* weakrefs;  // torch.jit.script keeps weak references to the callables it resolves
};

PyObject* g_op_call_type = nullptr;

// RuntimeError, ValueError, TypeError, looked up at import: the library refers to no data
// symbol of Python (PyExc_*, Py_None), only to functions, so that a C++ program without
// Python can dlopen it lazily to register the ops (examples/aoti).
PyObject* g_runtime_error = nullptr;
PyObject* g_value_error = nullptr;
PyObject* g_type_error = nullptr;
PyObject* g_oom_error = nullptr;  // torch.OutOfMemoryError

// torch._C._get_deterministic_algorithms and _get_deterministic_fill_uninitialized_memory
// (_set_setting_readers), or NULL.
PyObject* g_get_deterministic = nullptr;
PyObject* g_get_fill = nullptr;

// The truth of reader(); -1 with an exception set.
int read_flag(PyObject* reader) {
    PyObject* value = PyObject_CallObject(reader, nullptr);
    if (value == nullptr) return -1;
    const int flag = PyObject_IsTrue(value);
    Py_DECREF(value);
    return flag;
}

// RuntimeError("ValueError: <message>") -> ValueError("<message>"), likewise TypeError and
// torch.OutOfMemoryError; any
// other pending exception stays as it is.
void translate_error() {
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
    if (type == nullptr || !PyErr_GivenExceptionMatches(type, g_runtime_error)) {
        PyErr_Restore(type, value, traceback);
        return;
    }
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject* text = value != nullptr ? PyObject_Str(value) : nullptr;
    PyObject* bytes = text != nullptr ? PyUnicode_AsUTF8String(text) : nullptr;
    const char* message = bytes != nullptr ? PyBytes_AsString(bytes) : nullptr;
    PyObject* kind = nullptr;
    size_t skip = 0;
    if (message != nullptr && strncmp(message, "ValueError: ", 12) == 0) {
        kind = g_value_error;
        skip = 12;
    } else if (message != nullptr && strncmp(message, "TypeError: ", 11) == 0) {
        kind = g_type_error;
        skip = 11;
    } else if (message != nullptr && strncmp(message, "OutOfMemoryError: ", 18) == 0) {
        kind = g_oom_error;
        skip = 18;
    }
    if (kind != nullptr) {
        PyErr_SetString(kind, message + skip);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
    } else {
        PyErr_Clear();  // a failure of str() above
        PyErr_Restore(type, value, traceback);
    }
    Py_XDECREF(bytes);
    Py_XDECREF(text);
}

PyObject* op_call(PyObject* self, PyObject* args, PyObject* kwargs) {
    OpCall* call = reinterpret_cast<OpCall*>(self);
    pcops::CallState state;
    if (g_get_deterministic != nullptr) {
        int flag = read_flag(g_get_deterministic);
        if (flag == 1 && g_get_fill != nullptr) flag = read_flag(g_get_fill);
        if (flag < 0) return nullptr;
        state.fill_uninitialized = flag == 1;
    }
    if (call->get_mode != nullptr) {
        PyObject* mode = PyObject_CallObject(call->get_mode, nullptr);
        if (mode == nullptr) return nullptr;
        const long value = PyLong_AsLong(mode);
        Py_DECREF(mode);
        if (value == -1 && PyErr_Occurred()) return nullptr;
        state.sync_debug_mode = (int)value;
    }
    pcops::CallState& current = pcops::call_state();
    const pcops::CallState outer = current;  // a hooked call inside this one restores it
    current = state;
    PyObject* result = PyObject_Call(call->op, args, kwargs);
    current = outer;
    if (result == nullptr) translate_error();
    return result;
}

void op_call_dealloc(PyObject* self) {
    OpCall* call = reinterpret_cast<OpCall*>(self);
    PyTypeObject* type = Py_TYPE(self);
    if (call->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
    Py_XDECREF(call->op);
    Py_XDECREF(call->get_mode);
    reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free))(self);
    Py_DECREF(type);
}

PyObject* op_call_wrapped(PyObject* self, void*) {
    PyObject* op = reinterpret_cast<OpCall*>(self)->op;
    Py_INCREF(op);
    return op;
}

PyObject* op_call_repr(PyObject* self) {
    return PyUnicode_FromFormat("<pcops call hook of %R>", reinterpret_cast<OpCall*>(self)->op);
}

PyGetSetDef op_call_getset[] = {
    {"__wrapped__", op_call_wrapped, nullptr, "the callable the hook calls", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// The offset of the weak reference list, the limited API's way (tp_weaklistoffset is no slot).
PyMemberDef op_call_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(OpCall, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot op_call_slots[] = {
    {Py_tp_members, op_call_members},
    {Py_tp_call, reinterpret_cast<void*>(op_call)},
    {Py_tp_dealloc, reinterpret_cast<void*>(op_call_dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(op_call_repr)},
    {Py_tp_getset, op_call_getset},
    {0, nullptr},
};

PyType_Spec op_call_spec = {
    "pcops._C.OpCall", sizeof(OpCall), 0, Py_TPFLAGS_DEFAULT, op_call_slots,
};

// _wrap_op(op, get_mode) -> OpCall: `op` behind the hook; `get_mode` is a callable returning
// torch's sync debug mode (for the ops that synchronise) or None.
PyObject* wrap_op(PyObject*, PyObject* args) {
    PyObject *op = nullptr, *get_mode = nullptr;
    if (!PyArg_ParseTuple(args, "OO:_wrap_op", &op, &get_mode)) return nullptr;
    PyObject* self = PyType_GenericAlloc(reinterpret_cast<PyTypeObject*>(g_op_call_type), 0);
    if (self == nullptr) return nullptr;
    OpCall* call = reinterpret_cast<OpCall*>(self);
    Py_INCREF(op);
    call->op = op;
    if (PyCallable_Check(get_mode)) {
        Py_INCREF(get_mode);
        call->get_mode = get_mode;
    }
    return self;
}

// _set_setting_readers(get_deterministic, get_fill): the callables that read torch's
// deterministic settings for every hooked call (None: not read).
PyObject* set_setting_readers(PyObject*, PyObject* args) {
    PyObject *get_deterministic = nullptr, *get_fill = nullptr;
    if (!PyArg_ParseTuple(args, "OO:_set_setting_readers", &get_deterministic, &get_fill))
        return nullptr;
    PyObject* readers[2] = {get_deterministic, get_fill};
    PyObject** slots[2] = {&g_get_deterministic, &g_get_fill};
    for (int i = 0; i < 2; ++i) {
        PyObject* reader = PyCallable_Check(readers[i]) ? readers[i] : nullptr;
        Py_XINCREF(reader);
        Py_XDECREF(*slots[i]);
        *slots[i] = reader;
    }
    return Py_BuildValue("");  // None
}

PyMethodDef module_methods[] = {
    {"_wrap_op", wrap_op, METH_VARARGS,
     "_wrap_op(op, get_mode) -> the op's callable behind pcops' call hook (bindings/module.cpp)"},
    {"_set_setting_readers", set_setting_readers, METH_VARARGS,
     "_set_setting_readers(get_deterministic, get_fill): what the call hook reads of torch"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_C",  // name
    "pcops' compiled library: importing it registers torch.ops.pcops.*",
    -1,  // size of per-interpreter state
    module_methods,
    nullptr,  // slots
    nullptr,  // traverse
    nullptr,  // clear
    nullptr,  // free
};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) {
    if (g_op_call_type == nullptr) {
        PyObject* builtins = PyImport_ImportModule("builtins");
        if (builtins == nullptr) return nullptr;
        g_runtime_error = PyObject_GetAttrString(builtins, "RuntimeError");
        g_value_error = PyObject_GetAttrString(builtins, "ValueError");
        g_type_error = PyObject_GetAttrString(builtins, "TypeError");
        Py_DECREF(builtins);
        if (!g_runtime_error || !g_value_error || !g_type_error) return nullptr;
        PyObject* torch = PyImport_ImportModule("torch");
        if (torch == nullptr) return nullptr;
        g_oom_error = PyObject_GetAttrString(torch, "OutOfMemoryError");
        Py_DECREF(torch);
        if (!g_oom_error) return nullptr;
        g_op_call_type = PyType_FromSpec(&op_call_spec);
        if (g_op_call_type == nullptr) return nullptr;
    }
    return PyModule_Create(&module_def);
}
