/*
 * kubevol.mount._mountinfo: the native mountinfo parser.
 *
 * parse(data, cls, fallback) -> list parses a whole mountinfo text (bytes) into instances
 * of `cls` (kubevol.mount.mountinfo.MountInfo), exactly as the pure-Python parser in
 * kubevol/mount/mountinfo.py does: same fields, same decoding (UTF-8 with surrogateescape,
 * like os.fsdecode), blank lines skipped, trailing "\r"s dropped.
 *
 * Why native: a node with many pods has tens of thousands of mounts. Splitting a line into
 * fields, converting four numbers and building one object with eleven attributes costs
 * CPython about 4 us a line, far more than libmount's C parser spends (findmnt -F). Here a
 * line costs the allocation of its strings and one object.
 *
 * Octal escapes (the kernel's mangle_path writes space, tab, newline and backslash as
 * "\040", "\011", "\012", "\134") are decoded here too, in the four fields the Python
 * parser decodes (root, mount point, fs type, source) and exactly as it does: the field is
 * read as UTF-8 with surrogateescape, then every backslash followed by three octal digits
 * becomes the character of that number (chr(int(digits, 8)), 0 to 511: a code point, not a
 * byte), scanning left to right; any other backslash ("\04", "\999", a trailing one) stays
 * as it is. Options and optional fields keep their escapes, as in Python.
 *
 * Any line of another shape (malformed, a number Python's int() reads but a plain decimal
 * scan does not, more than NFIELDS_MAX fields) is handed to `fallback(line, lineno)`, the
 * Python line parser, which returns the entry or raises MountInfoError; so both paths give
 * the same answers and the same errors.
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
/* Only the stable ABI of Python 3.11: one build (an abi3 wheel) serves every later Python. */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include <string.h>

#define NFIELDS_MAX 64 /* more fields than that: leave the line to the fallback */

enum {
    A_ID, A_PARENT_ID, A_MAJOR, A_MINOR, A_ROOT, A_MOUNT_POINT, A_OPTIONS,
    A_OPTIONAL_FIELDS, A_FS_TYPE, A_SOURCE, A_SUPER_OPTIONS, A_COUNT
};
static const char *const attr_names[A_COUNT] = {
    "id", "parent_id", "major", "minor", "root", "mount_point", "options",
    "optional_fields", "fs_type", "source", "super_options",
};
static PyObject *interned[A_COUNT];

typedef struct {
    const char *start;
    Py_ssize_t len;
} field;

static PyObject *decode(const char *s, Py_ssize_t len) {
    return PyUnicode_DecodeUTF8(s, len, "surrogateescape");
}

#define ESCAPE_STACK 512 /* a decoded field up to this long is built on the stack */

static int is_octal(char c) {
    return c >= '0' && c <= '7';
}

/* decode(), then the octal escapes of mountinfo.unescape() decoded. The escapes are
 * replaced by the UTF-8 encoding of their code point (one byte below 0x80, two up to 0777)
 * and the whole decoded once: bytes >= 0x80 of the field that are not valid UTF-8 still
 * become one lone surrogate each, because a complete sequence the replacement inserts
 * neither continues an incomplete sequence before it nor is continued by bytes after it.
 * The result never grows: four bytes of escape give at most two. */
static PyObject *decode_escaped(const char *s, Py_ssize_t len) {
    const char *bs = memchr(s, '\\', (size_t)len);
    if (bs == NULL) {
        return decode(s, len);
    }
    char stack[ESCAPE_STACK];
    char *buf = len <= ESCAPE_STACK ? stack : PyMem_Malloc((size_t)len);
    if (buf == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t done = bs - s;
    memcpy(buf, s, (size_t)done);
    Py_ssize_t out = done;
    Py_ssize_t i = done;
    while (i < len) {
        if (s[i] == '\\' && len - i >= 4 && is_octal(s[i + 1]) && is_octal(s[i + 2])
            && is_octal(s[i + 3])) {
            unsigned code = (unsigned)(s[i + 1] - '0') << 6 | (unsigned)(s[i + 2] - '0') << 3
                            | (unsigned)(s[i + 3] - '0');
            if (code < 0x80) {
                buf[out++] = (char)code;
            } else {
                buf[out++] = (char)(0xC0 | code >> 6);
                buf[out++] = (char)(0x80 | (code & 0x3F));
            }
            i += 4;
        } else {
            buf[out++] = s[i++];
        }
    }
    PyObject *result = decode(buf, out);
    if (buf != stack) {
        PyMem_Free(buf);
    }
    return result;
}

/* A non-negative decimal that fits a long long, or -1. */
static long long decimal(const char *s, Py_ssize_t len) {
    if (len == 0 || len > 18) {
        return -1;
    }
    long long value = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }
        value = value * 10 + (s[i] - '0');
    }
    return value;
}

/* A tuple of the comma-separated parts of f (one empty part for an empty field). */
static PyObject *split_commas(field f) {
    Py_ssize_t parts = 1;
    for (Py_ssize_t i = 0; i < f.len; i++) {
        parts += f.start[i] == ',';
    }
    PyObject *tuple = PyTuple_New(parts);
    if (tuple == NULL) {
        return NULL;
    }
    const char *begin = f.start;
    const char *end = f.start + f.len;
    for (Py_ssize_t k = 0; k < parts; k++) {
        const char *comma = memchr(begin, ',', (size_t)(end - begin));
        const char *stop = comma ? comma : end;
        PyObject *part = decode(begin, stop - begin);
        if (part == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        if (PyTuple_SetItem(tuple, k, part) < 0) { /* steals part */
            Py_DECREF(tuple);
            return NULL;
        }
        begin = stop + 1;
    }
    PyObject_GC_UnTrack(tuple); /* strings only: no cycle possible (CPython's GC would untrack it too) */
    return tuple;
}

/* The entry for one line whose fields are ordinary, or NULL with an exception set.
 * Returns Py_None (a new reference) when the line must go to the fallback. */
static PyObject *parse_fields(PyTypeObject *cls, field *fields, int n) {
    int sep = -1;
    for (int i = 6; i < n; i++) {
        if (fields[i].len == 1 && fields[i].start[0] == '-') {
            sep = i;
            break;
        }
    }
    if (sep < 0 || n - sep - 1 != 3) {
        Py_RETURN_NONE;
    }
    const char *colon = memchr(fields[2].start, ':', (size_t)fields[2].len);
    if (colon == NULL) {
        Py_RETURN_NONE;
    }
    long long numbers[4] = {
        decimal(fields[0].start, fields[0].len),
        decimal(fields[1].start, fields[1].len),
        decimal(fields[2].start, colon - fields[2].start),
        decimal(colon + 1, fields[2].start + fields[2].len - colon - 1),
    };
    for (int i = 0; i < 4; i++) {
        if (numbers[i] < 0) {
            Py_RETURN_NONE;
        }
    }
    PyObject *values[A_COUNT] = {NULL};
    PyObject *entry = NULL;
    for (int i = 0; i < 4; i++) {
        values[A_ID + i] = PyLong_FromLongLong(numbers[i]);
        if (values[A_ID + i] == NULL) {
            goto done;
        }
    }
    if (!(values[A_ROOT] = decode_escaped(fields[3].start, fields[3].len))
        || !(values[A_MOUNT_POINT] = decode_escaped(fields[4].start, fields[4].len))
        || !(values[A_OPTIONS] = split_commas(fields[5]))
        || !(values[A_OPTIONAL_FIELDS] = PyTuple_New(sep - 6))
        || !(values[A_FS_TYPE] = decode_escaped(fields[sep + 1].start, fields[sep + 1].len))
        || !(values[A_SOURCE] = decode_escaped(fields[sep + 2].start, fields[sep + 2].len))
        || !(values[A_SUPER_OPTIONS] = split_commas(fields[sep + 3]))) {
        goto done;
    }
    for (int i = 6; i < sep; i++) {
        PyObject *opt = decode(fields[i].start, fields[i].len);
        if (opt == NULL) {
            goto done;
        }
        if (PyTuple_SetItem(values[A_OPTIONAL_FIELDS], i - 6, opt) < 0) { /* steals opt */
            goto done;
        }
    }
    PyObject_GC_UnTrack(values[A_OPTIONAL_FIELDS]);
    /* The class is frozen: set the slots the way its own __init__ does (object.__setattr__). */
    allocfunc alloc = (allocfunc)PyType_GetSlot(cls, Py_tp_alloc);
    entry = alloc == NULL ? NULL : alloc(cls, 0);
    if (entry == NULL) {
        goto done;
    }
    for (int i = 0; i < A_COUNT; i++) {
        if (PyObject_GenericSetAttr(entry, interned[i], values[i]) < 0) {
            Py_CLEAR(entry);
            goto done;
        }
    }
    /* Numbers, strings and untracked tuples of strings: the entry cannot be part of a
     * cycle, so the collector need not walk the tens of thousands of them. */
    if (PyType_IS_GC(Py_TYPE(entry))) {
        PyObject_GC_UnTrack(entry);
    }
done:
    for (int i = 0; i < A_COUNT; i++) {
        Py_XDECREF(values[i]);
    }
    return entry;
}

static PyObject *parse(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyTypeObject *cls;
    PyObject *fallback;
    if (!PyArg_ParseTuple(args, "y*O!O:parse", &data, &PyType_Type, &cls, &fallback)) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    /* Nothing built here can form a cycle; collecting while the list grows would only
     * walk it again and again. */
    int gc_was_enabled = PyGC_Disable();
    const char *pos = data.buf;
    const char *end = pos + data.len;
    long lineno = 0;
    field fields[NFIELDS_MAX];
    while (pos < end) {
        lineno++;
        const char *nl = memchr(pos, '\n', (size_t)(end - pos));
        const char *stop = nl ? nl : end;
        const char *next = nl ? nl + 1 : end;
        while (stop > pos && stop[-1] == '\r') {
            stop--;
        }
        if (stop == pos) {
            pos = next;
            continue;
        }
        int n = 0;
        int fits = 1; /* at most NFIELDS_MAX fields */
        const char *begin = pos;
        for (;;) {
            const char *space = memchr(begin, ' ', (size_t)(stop - begin));
            if (n == NFIELDS_MAX) {
                fits = 0;
                break;
            }
            fields[n].start = begin;
            fields[n].len = (space ? space : stop) - begin;
            n++;
            if (space == NULL) {
                break;
            }
            begin = space + 1;
        }
        PyObject *entry = fits ? parse_fields(cls, fields, n) : (Py_INCREF(Py_None), Py_None);
        if (entry == Py_None) {
            Py_DECREF(entry);
            PyObject *line = decode(pos, stop - pos);
            entry = line ? PyObject_CallFunction(fallback, "Nl", line, lineno) : NULL;
        }
        if (entry == NULL || PyList_Append(out, entry) < 0) {
            Py_XDECREF(entry);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(entry);
        pos = next;
    }
    if (gc_was_enabled) {
        PyGC_Enable();
    }
    PyBuffer_Release(&data);
    return out;
}

/* containing(data, paths) -> list: for each path (bytes, escaped as in mountinfo), the
 * (start, stop) offsets of the last line whose mount point (the fifth field) is that path or
 * one of its ancestors, or None. One pass over the text, comparing field five in place:
 * Kubernetes' SearchMountPoints reverse scan without parsing any line. */
static PyObject *containing(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyObject *paths;
    if (!PyArg_ParseTuple(args, "y*O!:containing", &data, &PyTuple_Type, &paths)) {
        return NULL;
    }
    Py_ssize_t npaths = PyTuple_Size(paths);
    const char **want = PyMem_Calloc((size_t)npaths + 1, sizeof(char *));
    Py_ssize_t *want_len = PyMem_Calloc((size_t)npaths + 1, sizeof(Py_ssize_t));
    Py_ssize_t *found = PyMem_Calloc((size_t)npaths + 1, 2 * sizeof(Py_ssize_t));
    PyObject *out = NULL;
    if (want == NULL || want_len == NULL || found == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < npaths; k++) {
        PyObject *item = PyTuple_GetItem(paths, k); /* borrowed */
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "paths must be bytes");
            goto done;
        }
        want[k] = PyBytes_AsString(item);
        want_len[k] = PyBytes_Size(item);
        found[2 * k] = found[2 * k + 1] = -1;
    }
    const char *base = data.buf;
    const char *pos = base;
    const char *end = base + data.len;
    while (pos < end) {
        const char *nl = memchr(pos, '\n', (size_t)(end - pos));
        const char *stop = nl ? nl : end;
        const char *field = pos;
        int skipped = 0;
        while (skipped < 4 && field < stop) {
            const char *space = memchr(field, ' ', (size_t)(stop - field));
            if (space == NULL) {
                break;
            }
            field = space + 1;
            skipped++;
        }
        if (skipped == 4) {
            const char *space = memchr(field, ' ', (size_t)(stop - field));
            Py_ssize_t len = (space ? space : stop) - field;
            for (Py_ssize_t k = 0; k < npaths; k++) {
                /* The path itself, "/", or a prefix of the path ending at a "/" of it. */
                int hit = len > 0 && len <= want_len[k] && memcmp(field, want[k], (size_t)len) == 0
                          && (len == want_len[k] || want[k][len] == '/' || (len == 1 && field[0] == '/'));
                if (hit) {
                    found[2 * k] = pos - base;
                    found[2 * k + 1] = stop - base;
                }
            }
        }
        pos = nl ? nl + 1 : end;
    }
    out = PyList_New(npaths);
    if (out == NULL) {
        goto done;
    }
    for (Py_ssize_t k = 0; k < npaths; k++) {
        PyObject *span;
        if (found[2 * k] < 0) {
            span = Py_NewRef(Py_None);
        } else {
            span = Py_BuildValue("(nn)", found[2 * k], found[2 * k + 1]);
            if (span == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        }
        if (PyList_SetItem(out, k, span) < 0) { /* steals span */
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    PyMem_Free(want);
    PyMem_Free(want_len);
    PyMem_Free(found);
    PyBuffer_Release(&data);
    return out;
}

/* lines_with(data, needle) -> list: the (start, stop) offsets of every line containing
 * needle, in table order, each line once (memmem: the search runs at memory speed). */
static PyObject *lines_with(PyObject *self, PyObject *args) {
    Py_buffer data, needle;
    if (!PyArg_ParseTuple(args, "y*y*:lines_with", &data, &needle)) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    const char *base = data.buf;
    const char *pos = base;
    const char *end = base + data.len;
    while (out != NULL && needle.len > 0 && pos < end) {
        const char *hit = memmem(pos, (size_t)(end - pos), needle.buf, (size_t)needle.len);
        if (hit == NULL) {
            break;
        }
        const char *start = hit;
        while (start > base && start[-1] != '\n') {
            start--;
        }
        const char *nl = memchr(hit, '\n', (size_t)(end - hit));
        const char *stop = nl ? nl : end;
        PyObject *span = Py_BuildValue("(nn)", start - base, stop - base);
        if (span == NULL || PyList_Append(out, span) < 0) {
            Py_XDECREF(span);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(span);
        pos = nl ? nl + 1 : end;
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&needle);
    return out;
}

static PyMethodDef methods[] = {
    {"lines_with", lines_with, METH_VARARGS,
     "lines_with(data, needle) -> list: the span of every line containing needle."},
    {"parse", parse, METH_VARARGS,
     "parse(data, cls, fallback) -> list: every entry of a mountinfo text (see the module)."},
    {"containing", containing, METH_VARARGS,
     "containing(data, paths) -> list: the span of the last line mounted over each path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mountinfo", "The native mountinfo parser.", -1, methods,
};

PyMODINIT_FUNC PyInit__mountinfo(void) {
    for (int i = 0; i < A_COUNT; i++) {
        interned[i] = PyUnicode_InternFromString(attr_names[i]);
        if (interned[i] == NULL) {
            return NULL;
        }
    }
    return PyModule_Create(&module);
}
