"""What the host serves plugins from Kubernetes objects: ConfigMaps and Secrets
(:mod:`~kubevol.k8s.objects`), service-account tokens (:mod:`~kubevol.k8s.tokens`), field
paths (:mod:`~kubevol.k8s.fieldpath`) and container environments (:mod:`~kubevol.k8s.podenv`),
and the parts of a pod all of them read (:mod:`~kubevol.k8s.pod`)."""
