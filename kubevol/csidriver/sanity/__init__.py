"""A CSI conformance suite any driver can run, as a pytest plugin (csi-sanity for Python).

Run it against a driver listening on a socket::

    pytest --pyargs kubevol.csidriver.sanity --csi-endpoint unix:///run/csi/csi.sock \\
        [--csi-staging-dir DIR] [--csi-mount-dir DIR] [--csi-volume-size 10Gi] \\
        [--csi-access-type mount|block] [--csi-secrets-file F] [--csi-params-file F] \\
        [--csi-test-node-volume-attach-limit] [--csi-create-mount-path-cmd CMD ...]

or with csi-sanity's own flags: ``python -m kubevol.csidriver.sanity --csi.endpoint ...``
(``--help`` lists them, ``--version`` prints the suite's version), or from a driver's own
test with :func:`kubevol.csidriver.sanity.runner.run_suite`, whose report names each failed
test, the rule it checks and why it failed first. The options are registered by
:mod:`kubevol.csidriver.sanity.plugin` (a ``pytest11`` entry point), which adds no tests of its
own to other test runs.

What it checks is what upstream csi-sanity checks, spec by spec
(:mod:`kubevol.csidriver.sanity.coverage` lists them with the test covering each), with the same
defaults (10 GiB volumes, expansion by 1 GiB, every mutating call repeated 10 times, the
target at ``<mount dir>/<test>/target`` created and removed by the driver) and the same
hooks (path commands for drivers whose paths live in a container, the node attach-limit
test, topology requirements from NodeGetInfo). Where csi-sanity is stricter than the CSI
spec, this suite follows the spec and the test's docstring says so. Groups whose capability
the driver does not advertise are skipped. This package imports neither pytest nor grpc at
import time.
"""
