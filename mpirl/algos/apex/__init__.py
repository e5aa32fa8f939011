"""Ape-X DQN (Horgan et al. 2018) with the replay on the buffer ranks or on the learner (Morishima & Matsutani 2024)."""
