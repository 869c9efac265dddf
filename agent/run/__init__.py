"""The ONNX Runtime workload runner behind ``aaco run`` and the ``ort`` source."""
