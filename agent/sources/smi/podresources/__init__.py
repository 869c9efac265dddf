"""The kubelet pod-resources API (v1): the proto, and its generated (checked-in) Python stubs."""
