# Tensor parallelism: the process group and the follower ranks.
