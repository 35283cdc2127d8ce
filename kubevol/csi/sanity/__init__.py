"""A CSI conformance suite any driver can run, as a pytest plugin (csi-sanity for Python).

Run it against a driver listening on a socket::

    pytest --pyargs kubevol.csi.sanity --csi-endpoint unix:///run/csi/csi.sock \\
        [--csi-staging-dir DIR] [--csi-mount-dir DIR] [--csi-volume-size 64Mi] \\
        [--csi-access-type mount|block] [--csi-secrets-file F] [--csi-params-file F]

The options are registered by :mod:`kubevol.csi.sanity.plugin` (a ``pytest11`` entry
point), which adds no tests of its own to other test runs. Groups whose capability the
driver does not advertise are skipped; every mutating call is repeated to check that it is
idempotent. This package imports neither pytest nor grpc at import time.
"""
