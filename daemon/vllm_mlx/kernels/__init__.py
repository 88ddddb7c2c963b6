"""C++ sources of the optional MLX CPU extension (quantized matmul); see models/cpu/qmm.py."""
