"""What a ReplanWarning, or an InfeasibleBudgetError or CaptureError met while planning another
step, says about why the optimized module planned that step (NOTE [New input shapes] in
monet_opt/module.py). `why` is a key of WHAT_TO_DO."""
from __future__ import annotations

from monet_opt.units import format_bytes

MANY_SHAPES = 4  # more plans than this, and the warning suggests padding to a few lengths


def situation(why: str, resident_bytes: int) -> str:
    return {"resident": f"{format_bytes(resident_bytes)} of gradients resident at its start "
                        "(accumulation, zero_grad(set_to_none=False), an input's .grad kept), "
                        "which the limit must hold too",
            "params": "parameters or buffers changed since optimize() (added, removed, tied, "
                      "requires_grad, shape, dtype, device or layout)",
            "outputs_held": "a caller that holds the step's outputs through its backward",
            "autocast": "a step under another autocast state or torch setting (attention "
                        "kernels: sdpa_kernel; oneDNN, cuDNN or deterministic algorithms on or "
                        "off; threads; float32 matmul precision; default dtype; a "
                        "torch.profiler running) than optimize() was called in",
            "hooks": "module hooks added or removed since optimize()",
            "structure": "inputs structured otherwise than the sample (other arguments)",
            "sharing": "inputs that share storages otherwise than the sample's",
            "attributes": "modules or their attributes changed since optimize()",
            "input_grads": "inputs that require a gradient where the sample's did not, or the "
                           "other way round",
            "dtypes": "inputs of other dtypes than the sample's",
            "entries": "sparse inputs with another number of entries than the sample's",
            "layouts": "inputs laid out otherwise than the sample (their strides, or a "
                       "larger storage they view)",
            "shapes": "inputs of new shapes"}[why]


WHAT_TO_DO = {
    "params": "Parameters or buffers added, removed or tied, or whose requires_grad, shape, "
              "dtype, device or layout changed since optimize() (layers frozen or unfrozen, "
              "the model made channels-last), need a "
              "step traced for them (NOTE [Parameters changed]).",
    "resident": "Gradients in place at a step's start (accumulating over micro-batches, "
                "zero_grad(set_to_none=False), zero_grad() between the forward and the "
                "backward, as PyTorch Lightning's loop calls it, or an input's gradient zeroed "
                "in place: set it to None if it is not needed) are held through the whole "
                "step, so less of the limit is left for activations. A limit given as a share "
                "(\"100% of peak\") "
                "became bytes for the step optimize() planned, which began without them: give "
                "it in bytes with room for them.",
    "outputs_held": "The caller held the outputs through the backward (out = opt(x); "
                    "loss = loss_fn(out, y); loss.backward()), so from now on the plan holds "
                    "them to the step's end (NOTE [Outputs held through the backward]); to "
                    "keep the tighter plan, let go of them before the backward, or use "
                    "monet_opt.WithLoss.",
    "autocast": "A step is traced under the autocast state it runs in (its casts are ops of "
                "its graph: NOTE [Autocast is traced]), so each state is a step of its own; call "
                "optimize() inside the torch.autocast block you train in (an accelerate "
                "Accelerator prepared after optimize() runs every step under autocast); a "
                "step run under another state on purpose (in float32 after a mixed-precision "
                "optimize()) is planned under the same limit, which must hold it too. A torch "
                "setting that picks other kernels (threads, oneDNN, matmul precision) changes "
                "the step's memory alike: set it before optimize(), as you train. A step "
                "planned inside torch.profiler counts no kernels' scratch, so run outside one "
                "it is planned again (NOTE [Plans made inside a profiler]).",
    "hooks": "What a module hook computes on tensors is traced into the step, so each set of "
             "hooks is a step of its own (NOTE [Module hooks]); a hook registered anew for "
             "every step makes a plan each time: keep it registered.",
    "structure": "Each structure of inputs (which arguments, keywords included, and the "
                 "value of each that is not a tensor) is a step of its own (HF's Trainer adds "
                 "num_items_in_batch for a model whose forward takes **kwargs); a number that "
                 "changes from call to call (a count of tokens) makes a plan for each value: "
                 "pass it as a tensor (torch.tensor(n)), an input of the step, where the "
                 "forward computes with it; one that picks the code run (a task's head, a "
                 "branch) cannot be a tensor: each value's plan is made once and kept.",
    "sharing": "A plan counts an input passed twice (labels=input_ids) once, so inputs that "
               "share storages otherwise than the sample's hold other bytes; pass them as the "
               "sample did.",
    "attributes": "A module's class, train/eval flag and each number or flag its forward "
                  "reads are constants of the traced step, so each value is a step of its own "
                  "(NOTE [Attributes read as constants]); to change a number every step "
                  "without a plan each time, keep it in a buffer (register_buffer) and change "
                  "that: buffers are inputs of the step.",
    "input_grads": "An input that requires a gradient (adversarial training, saliency) "
                   "makes the backward compute its gradient too: a step of its own; give "
                   "optimize() a sample that does as your steps do.",
    "dtypes": "A step is traced for its inputs' dtypes (NOTE [Inputs of other dtypes]): give "
              "optimize() a sample of the dtype your batches have.",
    "entries": "A sparse input's number of entries sizes its indices and values, and what the "
               "ops on it make, so each number is a step of its own (NOTE [Sparse inputs] in "
               "monet_opt/memory.py); where it changes every batch (a graph's adjacency), "
               "pad each to one of a few fixed counts with zero-valued entries, or pass it "
               "dense.",
    "layouts": "A step is traced for its inputs' strides (a channels-last or permuted batch "
               "where the sample was contiguous), and counts a larger storage an input views "
               "(a batch sliced from a data set on the device): give optimize() a sample laid "
               "out as your batches are, or pass batches of their own (x.clone()) (NOTEs "
               "[Input layouts], [Inputs viewing more] in monet_opt/input_spec.py).",
    "shapes": "DataLoader(drop_last=True) keeps every batch the sample's shape, and "
              "sequences padded or cut to the sample's length keep its length; "
              "optimize(..., new_shapes='error') refuses other shapes."}


def too_many(plans: int, why: str) -> str:
    """Advice once a module has planned more shapes than a last batch explains."""
    if plans <= MANY_SHAPES:
        return ""
    return f" {plans} plans: " + _MANY.get(why, "each change of this kind makes one; change it "
                                                "less often.")


_MANY = {"attributes": "a value changed every step makes one each; keep it in a buffer.",
         "structure": "a number passed with other values makes one each; pass it as a tensor.",
         "entries": "sparse inputs of varying entries make one each; pad them to a few fixed "
                    "counts.",
         "hooks": "a hook registered anew makes one each time; register it once and keep it.",
         "shapes": "inputs of varying length (dynamic padding) make one each; pad them to a few "
                   "fixed lengths (buckets) so that each is planned once."}


def call_hints(hints: str) -> str:
    """What a CaptureError of a call of the optimized module says to try: the hints of
    optimize()'s, whose eager run of the model was on this call's inputs."""
    eager = "the model fails on sample_input run eagerly too"
    if hints.startswith(eager):  # capture_hints.what_to_try ran the model on them
        return ("\nWhat to try: the model fails on these inputs run eagerly too" +
                hints[len(eager):].replace("fix the sample input", "fix these inputs", 1))
    return (" Where the model fails on these inputs when run eagerly (opt.model(...)), they are "
            "what to change." + (f"\nElse: {hints}" if hints else ""))
