/* One field of many decoded trace events, written into a numpy column in one C loop.
 *
 * Why C: folding a rank's events into columns pulled each field out with
 * np.fromiter(map(attrgetter(...), events)), about 65 ns per event per field in the
 * interpreter's iterator protocol (a Python float or int made and read back each time), as
 * much as msgspec took to decode the events in the first place (docs/analyze.md). Here the
 * field is read straight from the struct's slot (msgspec structs keep their fields at fixed
 * offsets, which the type's member descriptors give) and written to the column's buffer.
 *
 * gather(out, seq, idx, attrs, kind, arg=None)
 *   out    a writable C-contiguous buffer (a numpy array) of len(idx) (or len(seq)) items
 *   seq    a list or tuple of objects (the events)
 *   idx    None (every item of seq) or an int64 buffer of positions in seq
 *   attrs  a tuple of one or two attribute names: the field, or a field of a field
 *   kind   what to write per item:
 *            'd' float64 of a number          'q' int64 of an int
 *            'i' int32 arg[value]             'b' int8 arg[value]   (arg: a mapping; for a
 *                                           dict subclass, a miss calls its __missing__, and any
 *                                           __getitem__ it overrides is not called)
 *            'n' bool: value is not None      'e' bool: value == arg
 *            'l' int64 len(value)
 * Any object of another type than the first one's is read with getattr, so the result is
 * always what the Python expression would give; a value of the wrong type raises TypeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

typedef struct {
    PyObject *name;
    PyTypeObject *type; /* type whose slot offset is cached, or NULL */
    Py_ssize_t offset;
} Field;

static void field_init(Field *f, PyObject *name) {
    f->name = name;
    f->type = NULL;
    f->offset = -1;
}

/* New reference to obj.<field>, or NULL with an exception set. */
static PyObject *field_get(Field *f, PyObject *obj) {
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == f->type) {
        PyObject *v = *(PyObject **)((char *)obj + f->offset);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
        return PyObject_GetAttr(obj, f->name); /* raises AttributeError as Python would */
    }
    if (f->type == NULL) {
        /* cache the slot of this type's field: a member descriptor holding an object */
        PyObject *descr = PyObject_GetAttr((PyObject *)tp, f->name);
        if (descr == NULL) {
            PyErr_Clear(); /* the instance's getattr below says what is wrong */
        } else {
            if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
                PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
                if (m->type == T_OBJECT_EX || m->type == T_OBJECT) {
                    f->type = tp;
                    f->offset = m->offset;
                }
            }
            Py_DECREF(descr);
            if (f->type == tp) return field_get(f, obj);
        }
    }
    return PyObject_GetAttr(obj, f->name);
}

static int write_item(char kind, char *out, Py_ssize_t i, PyObject *v, PyObject *arg) {
    switch (kind) {
    case 'd': {
        double d = PyFloat_CheckExact(v) ? PyFloat_AS_DOUBLE(v) : PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        ((double *)out)[i] = d;
        return 0;
    }
    case 'q': {
        if (!PyLong_Check(v)) {
            PyErr_Format(PyExc_TypeError, "expected an int, got %.100s", Py_TYPE(v)->tp_name);
            return -1;
        }
        long long q = PyLong_AsLongLong(v);
        if (q == -1 && PyErr_Occurred()) return -1;
        ((long long *)out)[i] = q;
        return 0;
    }
    case 'i':
    case 'b': {
        PyObject *r = NULL;
        if (PyDict_Check(arg)) { /* a dict, or a subclass that adds only __missing__ */
            r = PyDict_GetItemWithError(arg, v); /* borrowed */
            if (r != NULL) {
                Py_INCREF(r);
            } else if (PyErr_Occurred()) {
                return -1;
            }
        }
        if (r == NULL) {
            r = PyObject_GetItem(arg, v); /* a miss: __missing__ of a dict subclass */
            if (r == NULL) return -1;
        }
        long x = PyLong_AsLong(r);
        Py_DECREF(r);
        if (x == -1 && PyErr_Occurred()) return -1;
        if (kind == 'i') {
            if (x < INT32_MIN || x > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "id out of int32 range");
                return -1;
            }
            ((int32_t *)out)[i] = (int32_t)x;
        } else {
            if (x < INT8_MIN || x > INT8_MAX) {
                PyErr_SetString(PyExc_OverflowError, "code out of int8 range");
                return -1;
            }
            ((int8_t *)out)[i] = (int8_t)x;
        }
        return 0;
    }
    case 'n':
        ((char *)out)[i] = v != Py_None;
        return 0;
    case 'e': {
        int eq = v == arg ? 1 : PyObject_RichCompareBool(v, arg, Py_EQ);
        if (eq < 0) return -1;
        ((char *)out)[i] = (char)eq;
        return 0;
    }
    case 'l': {
        Py_ssize_t n = PyObject_Length(v);
        if (n < 0) return -1;
        ((long long *)out)[i] = n;
        return 0;
    }
    }
    PyErr_Format(PyExc_ValueError, "unknown kind %c", kind);
    return -1;
}

static Py_ssize_t item_size(char kind) {
    switch (kind) {
    case 'd': case 'q': case 'l': return 8;
    case 'i': return 4;
    case 'b': case 'n': case 'e': return 1;
    }
    return 0;
}

static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *out_obj, *seq, *idx_obj, *attrs, *arg = Py_None;
    int kind;
    if (!PyArg_ParseTuple(args, "OOOO!C|O", &out_obj, &seq, &idx_obj, &PyTuple_Type, &attrs,
                          &kind, &arg))
        return NULL;
    Py_ssize_t size = item_size((char)kind);
    if (size == 0) return PyErr_Format(PyExc_ValueError, "unknown kind %c", kind);
    if ((kind == 'i' || kind == 'b') && !PyMapping_Check(arg))
        return PyErr_Format(PyExc_TypeError, "kind %c needs a mapping", kind);
    Py_ssize_t depth = PyTuple_GET_SIZE(attrs);
    if (depth < 1 || depth > 2) return PyErr_Format(PyExc_ValueError, "one or two attribute names");
    Field fields[2];
    for (Py_ssize_t k = 0; k < depth; k++) {
        PyObject *name = PyTuple_GET_ITEM(attrs, k);
        if (!PyUnicode_Check(name)) return PyErr_Format(PyExc_TypeError, "attribute names are str");
        field_init(&fields[k], name);
    }
    PyObject *fast = PySequence_Fast(seq, "seq must be a list or tuple");
    if (fast == NULL) return NULL;
    Py_ssize_t n_seq = PySequence_Fast_GET_SIZE(fast);

    Py_buffer idx = {0}, out = {0};
    Py_ssize_t n = n_seq;
    const long long *pos = NULL;
    if (idx_obj != Py_None) {
        if (PyObject_GetBuffer(idx_obj, &idx, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
        if (idx.itemsize != 8 || idx.format == NULL || strchr("qln", idx.format[0]) == NULL) {
            PyErr_SetString(PyExc_TypeError, "idx must be an int64 array");
            goto fail;
        }
        n = idx.len / 8;
        pos = (const long long *)idx.buf;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto fail;
    if (out.itemsize != size || out.len != n * size) {
        PyErr_Format(PyExc_ValueError, "out must hold %zd items of %zd bytes", n, size);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = pos ? (Py_ssize_t)pos[i] : i;
        /* the size read again: a lookup's __missing__ runs Python code, which could change a list */
        if (j < 0 || j >= PySequence_Fast_GET_SIZE(fast)) {
            PyErr_SetString(PyExc_IndexError, "idx out of range");
            goto fail;
        }
        PyObject *item = PySequence_Fast_GET_ITEM(fast, j);
        Py_INCREF(item);
        PyObject *v = field_get(&fields[0], item);
        Py_DECREF(item);
        if (v == NULL) goto fail;
        if (depth == 2) {
            PyObject *w = field_get(&fields[1], v);
            Py_DECREF(v);
            if (w == NULL) goto fail;
            v = w;
        }
        int rc = write_item((char)kind, (char *)out.buf, i, v, arg);
        Py_DECREF(v);
        if (rc < 0) goto fail;
    }
    PyBuffer_Release(&out);
    if (pos) PyBuffer_Release(&idx);
    Py_DECREF(fast);
    Py_RETURN_NONE;
fail:
    if (out.obj) PyBuffer_Release(&out);
    if (idx.obj) PyBuffer_Release(&idx);
    Py_DECREF(fast);
    return NULL;
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS,
     "gather(out, seq, idx, attrs, kind, arg=None): one field of seq[idx] into out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gather", "Columns of decoded trace events, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__gather(void) { return PyModule_Create(&module); }
