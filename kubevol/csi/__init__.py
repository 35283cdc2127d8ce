"""CSI for kubevol: the wire protocol, a client for any CSI driver, and a driver framework."""
