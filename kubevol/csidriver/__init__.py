"""The CSI driver kit, for driver authors (what gocsi and csi-test are for Go):

- :mod:`kubevol.csidriver.server` serves drivers written in Python, with gocsi's environment
  variables and middleware;
- :mod:`kubevol.csidriver.locks` holds the serial-volume lock providers (in process, etcd);
- :mod:`kubevol.csidriver.drivers` holds the bundled drivers (mock, hostpath);
- :mod:`kubevol.csidriver.sanity` is the conformance suite (a pytest plugin).

It shares only the protocol (:mod:`kubevol.csi`) with the node side."""
