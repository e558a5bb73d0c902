"""What to try where the forward makes a kind of tensor a traced step cannot hold (NOTE [Kinds
of tensor made in the forward])."""
from __future__ import annotations

# NOTE [Kinds of tensor made in the forward]
#   A nested tensor, a sparse tensor of a compressed layout (CSR, CSC, BSR) or a tensor
#   subclass that runs torch's functions its own way (torch.nn.attention.bias's CausalBias),
#   made inside the forward, fails to trace with an error from deep inside torch
#   ("self.shape_env must not be None", "layout_impl is only implemented for TensorImpl
#   subclasses", "Creating a new Tensor subclass CausalBias"), and the user was told to avoid
#   .item() (inputs probe, 2026-12-07). Each is named, with what to do instead: the same kinds
#   passed as inputs are refused with the same advice (NOTE [Tensor subclasses as inputs] in
#   monet_opt/input_spec.py); a sparse COO tensor made in the forward is refused by the memory
#   model (monet_opt/memory.py).
_KINDS = (
    ("self.shape_env must not be None",
     "a nested tensor (torch.nested) made in the forward cannot be traced: compute on padded "
     "tensors with a mask (torch.nested.to_padded_tensor), or optimize the modules around it "
     "and run that part as it is"),
    ("layout_impl is only implemented for TensorImpl subclasses",
     "a sparse tensor of a compressed layout (.to_sparse_csr(), CSC, BSR) made in the forward "
     "cannot be traced: build it outside the module as a sparse COO tensor (.to_sparse_coo()) "
     "and pass it in, or compute densely"),
    ("Creating a new Tensor subclass CausalBias",
     "torch.nn.attention.bias's CausalBias mask cannot be traced: pass is_causal=True to "
     "scaled_dot_product_attention for causal_upper_left, or the boolean mask "
     "torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L) for causal_lower_right"),
    ("Creating a new Tensor subclass",
     "a torch.Tensor subclass made in the forward cannot be traced: compute on plain tensors "
     "there, or optimize the modules around it and run that part as it is"),
)


def made_in_forward(errors: list[str]) -> str:
    """What to do where tracing failed on a kind of tensor made in the forward, else ""."""
    for found, said in _KINDS:
        if any(found in e for e in errors):
            return f"\nThere, {said}."
    return ""
