"""One model across several processes: MLX distributed group, lockstep scheduling."""
