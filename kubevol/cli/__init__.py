"""The ``kubevol`` command line. Each sub-command lives in its own module (see ``main``)."""
