"""Primitives that know no volume concept: backoff, deadlines, descriptor-relative tree walks
(:mod:`~kubevol.util.fdtree`), bounded YAML, JSON text, keyed locks, units, turn taking, the
C library handle. Nothing here imports another part of kubevol but the error tree."""
