"""The ONNX Runtime source and the workload behind ``aaco run``/``aaco graph``: models, sessions, inputs, graphs."""
