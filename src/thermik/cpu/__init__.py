"""CPU capability, C kernels and thread handling shared by the inference engine and the trainer (the ground floor)."""
