# Speculative decoding, by part: the proposers, the policy, the verification.
