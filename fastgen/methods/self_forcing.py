"""Self-Forcing (Huang et al. 2025, "Self Forcing: bridging the train-test gap in autoregressive video diffusion"):
a few-step block-causal student trained on its *own* autoregressive rollouts, with DMD2's distribution matching
against a bidirectional teacher and fake score on the whole generated video (``fastgen.methods.dmd2``).

The rollout (``rollout``) generates the video chunk by chunk exactly as sampling does - each chunk from noise
through the student's times ``t_list`` (x0, then re-noise to the next time), attending to the finished chunks in
the KV cache (``fastgen.networks.causal_dit``), then written into the cache at the context time - so training sees
the errors the student will see at test time (exposure bias is what teacher forcing and diffusion forcing leave).
Only one evaluation per chunk carries gradients: the chunk stops at an exit step drawn uniformly from the
student's steps, and that step's ``x0`` is the chunk's output; the earlier steps and the cache writes run without
gradients (Huang et al. 2025, Sec. 3.2, stochastic gradient truncation). The exit steps are drawn from the shared
stream (``self.rng.shared``), so every rank exits at the same steps and sharded networks run the same number of
collectives.

Sampling (``generate``) is the same rollout without gradients, every chunk through all of ``t_list``. The rollout,
the checks on the networks and sampling are ``fastgen.methods.causal.CausalDMD2Model``'s, shared with CausVid.
"""

from __future__ import annotations

import torch

from fastgen.methods.causal import CausalDMD2Model


class SelfForcingModel(CausalDMD2Model):
    method_name = "Self-Forcing"
    last_exit_steps: list[int] | None = None

    def exit_steps(self, chunks: int, device: torch.device) -> torch.Tensor:
        """``(chunks,)`` exit steps, uniform over the student's steps, the same on every rank (the shared stream)."""
        return self.rng.shared.randint(len(self.student_times()), (chunks,), device=device)

    def generate_for_training(self, noise: torch.Tensor, condition: torch.Tensor | None,
                              real: torch.Tensor | None = None) -> torch.Tensor:
        """The student's own rollout from ``noise``, each chunk stopped at its exit step (``real`` is not used)."""
        exits = self.exit_steps(noise.shape[2] // self.chunk_frames, noise.device).tolist()
        self.last_exit_steps = list(exits)  # what the last training rollout drew (for logs and checks)
        return self.rollout(self.net, noise, condition, exits, generator=self.rng)


__all__ = ["SelfForcingModel"]
