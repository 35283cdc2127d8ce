/*
 * kubevol.metrics._duwalk: the native du walker.
 *
 * walk(path, threads) -> (blocks, inodes) adds up st_blocks (512-byte units) and counts the
 * inodes of the tree at directory `path`, with the semantics documented in
 * kubevol/metrics/walk.py (which holds the pure-Python twin and the wrapper): one
 * filesystem only, a multiply-linked inode counted once, the root counted, symlinks not
 * followed below the root, ENOENT during the walk ignored, any other error raised as
 * OSError naming the path.
 *
 * Why native: per entry the work is one fstatat(2); CPython spends more time building the
 * stat result than the kernel spends in the call, so a Python walk cannot approach GNU du.
 * Here `threads` workers (the caller's thread included, with the GIL released) take
 * directories from one shared LIFO stack, stat their entries relative to the open
 * directory, and push the subdirectories they find; the kernel work runs on every CPU.
 */
#define PY_SSIZE_T_CLEAN
/* Only the stable ABI of Python 3.11: one build (an abi3 wheel) serves every later Python. */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_THREADS 64

/* A set of inode numbers (all on one device), open addressing; 0 marks a free slot, so
 * keys are stored as ino + 1. */
typedef struct {
    uint64_t *slots;
    size_t cap; /* a power of two */
    size_t len;
} inode_set;

typedef struct {
    pthread_mutex_t lock; /* guards everything below but `seen` */
    pthread_cond_t cond;
    char **stack;
    size_t stack_len, stack_cap;
    int active;   /* workers processing a directory right now */
    int failed;   /* set once; every worker stops */
    int err;      /* errno of the first failure */
    char *errpath;
    int oom;
    dev_t dev;
    unsigned long long blocks, inodes;
    pthread_mutex_t seen_lock;
    inode_set seen;
} walker;

static size_t hash_ino(uint64_t key, size_t cap) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
}

/* Insert ino; 1 if it was new, 0 if already there, -1 on allocation failure. */
static int set_add(inode_set *set, uint64_t ino) {
    uint64_t key = ino + 1;
    if ((set->len + 1) * 2 > set->cap) {
        size_t ncap = set->cap ? set->cap * 2 : 1024;
        uint64_t *nslots = calloc(ncap, sizeof(uint64_t));
        if (!nslots)
            return -1;
        for (size_t i = 0; i < set->cap; i++) {
            uint64_t k = set->slots[i];
            if (k) {
                size_t j = hash_ino(k, ncap);
                while (nslots[j])
                    j = (j + 1) & (ncap - 1);
                nslots[j] = k;
            }
        }
        free(set->slots);
        set->slots = nslots;
        set->cap = ncap;
    }
    size_t i = hash_ino(key, set->cap);
    while (set->slots[i]) {
        if (set->slots[i] == key)
            return 0;
        i = (i + 1) & (set->cap - 1);
    }
    set->slots[i] = key;
    set->len++;
    return 1;
}

/* Record the first failure and wake every worker so that they stop. Takes the lock. */
static void fail(walker *w, int err, const char *dir, const char *name) {
    pthread_mutex_lock(&w->lock);
    if (!w->failed) {
        w->failed = 1;
        w->err = err;
        size_t n = strlen(dir) + (name ? strlen(name) + 2 : 1);
        w->errpath = malloc(n);
        if (w->errpath) {
            if (name)
                snprintf(w->errpath, n, "%s%s%s", dir,
                         (dir[0] && dir[strlen(dir) - 1] == '/') ? "" : "/", name);
            else
                snprintf(w->errpath, n, "%s", dir);
        }
    }
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static char *join(const char *dir, const char *name) {
    size_t dl = strlen(dir), nl = strlen(name);
    int slash = !(dl && dir[dl - 1] == '/');
    char *p = malloc(dl + slash + nl + 1);
    if (!p)
        return NULL;
    memcpy(p, dir, dl);
    if (slash)
        p[dl] = '/';
    memcpy(p + dl + slash, name, nl + 1);
    return p;
}

/* Seen before? 1 yes, 0 no (now recorded), -1 out of memory. */
static int seen_before(walker *w, uint64_t ino) {
    pthread_mutex_lock(&w->seen_lock);
    int r = set_add(&w->seen, ino);
    pthread_mutex_unlock(&w->seen_lock);
    return r < 0 ? -1 : !r;
}

/* Stat every entry of `dir`; add to the totals; collect subdirectories in *subs. */
static void scan_dir(walker *w, const char *dir, int follow, unsigned long long *blocks,
                     unsigned long long *inodes, char ***subs, size_t *nsubs, size_t *csubs) {
    int flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW);
    int fd = open(dir, flags);
    if (fd < 0) {
        if (errno != ENOENT)
            fail(w, errno, dir, NULL);
        return;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        fail(w, errno, dir, NULL);
        close(fd);
        return;
    }
    struct stat st;
    struct dirent *e;
    for (;;) {
        errno = 0;
        e = readdir(d);
        if (!e) {
            if (errno && errno != ENOENT)
                fail(w, errno, dir, NULL);
            break;
        }
        const char *n = e->d_name;
        if (n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0)))
            continue;
        if (fstatat(fd, n, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT)
                continue;
            fail(w, errno, dir, n);
            break;
        }
        if (st.st_dev != w->dev)
            continue;
        if (st.st_nlink > 1) {
            int r = seen_before(w, (uint64_t)st.st_ino);
            if (r < 0) {
                w->oom = 1;
                fail(w, ENOMEM, dir, n);
                break;
            }
            if (r)
                continue;
        }
        *blocks += (unsigned long long)st.st_blocks;
        *inodes += 1;
        if (S_ISDIR(st.st_mode)) {
            if (*nsubs == *csubs) {
                size_t nc = *csubs ? *csubs * 2 : 16;
                char **ns = realloc(*subs, nc * sizeof(char *));
                if (!ns) {
                    fail(w, ENOMEM, dir, n);
                    break;
                }
                *subs = ns;
                *csubs = nc;
            }
            char *p = join(dir, n);
            if (!p) {
                fail(w, ENOMEM, dir, n);
                break;
            }
            (*subs)[(*nsubs)++] = p;
        }
        /* Read without the lock: a stale 0 only delays the stop a little. */
        if (__atomic_load_n(&w->failed, __ATOMIC_RELAXED))
            break;
    }
    closedir(d);
}

static void *worker(void *arg) {
    walker *w = arg;
    unsigned long long blocks = 0, inodes = 0;
    char **subs = NULL;
    size_t csubs = 0;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->failed && w->stack_len == 0 && w->active > 0)
            pthread_cond_wait(&w->cond, &w->lock);
        if (w->failed || w->stack_len == 0)
            break;
        char *dir = w->stack[--w->stack_len];
        w->active++;
        pthread_mutex_unlock(&w->lock);

        size_t nsubs = 0;
        scan_dir(w, dir, 0, &blocks, &inodes, &subs, &nsubs, &csubs);
        free(dir);

        pthread_mutex_lock(&w->lock);
        w->active--;
        if (nsubs && !w->failed) {
            if (w->stack_len + nsubs > w->stack_cap) {
                size_t nc = w->stack_cap ? w->stack_cap : 64;
                while (nc < w->stack_len + nsubs)
                    nc *= 2;
                char **ns = realloc(w->stack, nc * sizeof(char *));
                if (!ns) {
                    w->failed = 1;
                    w->err = ENOMEM;
                    w->oom = 1;
                } else {
                    w->stack = ns;
                    w->stack_cap = nc;
                }
            }
            if (!w->failed) {
                memcpy(w->stack + w->stack_len, subs, nsubs * sizeof(char *));
                w->stack_len += nsubs;
                nsubs = 0;
            }
        }
        for (size_t i = 0; i < nsubs; i++)
            free(subs[i]);
        if (w->stack_len || w->active == 0 || w->failed)
            pthread_cond_broadcast(&w->cond);
    }
    w->blocks += blocks;
    w->inodes += inodes;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    free(subs);
    return NULL;
}

static PyObject *duwalk_walk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *path_obj;
    int threads;
    if (!PyArg_ParseTuple(args, "O&i", PyUnicode_FSConverter, &path_obj, &threads))
        return NULL;
    if (threads < 1 || threads > MAX_THREADS) {
        Py_DECREF(path_obj);
        PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], got %d", MAX_THREADS,
                     threads);
        return NULL;
    }
    const char *path = PyBytes_AsString(path_obj);
    if (path == NULL) {
        Py_DECREF(path_obj);
        return NULL;
    }

    walker w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.cond, NULL);
    pthread_mutex_init(&w.seen_lock, NULL);
    int started = 0;
    pthread_t tids[MAX_THREADS];
    unsigned long long blocks = 0, inodes = 0;
    char **subs = NULL;
    size_t nsubs = 0, csubs = 0;

    Py_BEGIN_ALLOW_THREADS
    struct stat st;
    if (stat(path, &st) != 0) {
        fail(&w, errno, path, NULL);
    } else if (!S_ISDIR(st.st_mode)) {
        fail(&w, ENOTDIR, path, NULL);
    } else {
        w.dev = st.st_dev;
        if (st.st_nlink > 1 && set_add(&w.seen, (uint64_t)st.st_ino) < 0)
            fail(&w, ENOMEM, path, NULL);
        blocks = (unsigned long long)st.st_blocks;
        inodes = 1;
        /* The root is scanned here, following it if it is a symlink; its subdirectories
         * seed the shared stack. */
        if (!w.failed)
            scan_dir(&w, path, 1, &blocks, &inodes, &subs, &nsubs, &csubs);
        if (!w.failed) {
            w.stack = subs;
            w.stack_len = nsubs;
            w.stack_cap = csubs;
            subs = NULL;
            nsubs = 0;
        }
        w.blocks = blocks;
        w.inodes = inodes;
        for (int i = 1; i < threads && !w.failed && w.stack_len > 0; i++) {
            if (pthread_create(&tids[started], NULL, worker, &w) != 0)
                break; /* fewer threads is still correct */
            started++;
        }
        worker(&w);
        for (int i = 0; i < started; i++)
            pthread_join(tids[i], NULL);
    }
    Py_END_ALLOW_THREADS

    for (size_t i = 0; i < nsubs; i++)
        free(subs[i]);
    free(subs);
    for (size_t i = 0; i < w.stack_len; i++)
        free(w.stack[i]);
    free(w.stack);
    free(w.seen.slots);
    pthread_mutex_destroy(&w.lock);
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.seen_lock);

    PyObject *result = NULL;
    if (w.failed) {
        if (w.err == ENOMEM && w.oom) {
            PyErr_NoMemory();
        } else {
            errno = w.err;
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, w.errpath ? w.errpath : path);
        }
    } else {
        result = Py_BuildValue("(KK)", w.blocks, w.inodes);
    }
    free(w.errpath);
    Py_DECREF(path_obj);
    return result;
}

static PyMethodDef duwalk_methods[] = {
    {"walk", duwalk_walk, METH_VARARGS,
     "walk(path, threads) -> (blocks, inodes): du semantics, see kubevol.metrics.walk."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef duwalk_module = {
    PyModuleDef_HEAD_INIT, "_duwalk", "The native du walker of kubevol.metrics.walk.", -1,
    duwalk_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__duwalk(void) { return PyModule_Create(&duwalk_module); }
