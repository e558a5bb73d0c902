"""monet_opt: train PyTorch models in less memory at the least extra compute."""
from monet_opt.accumulate import AccumulationWarning
from monet_opt.api import lower_problem, optimize
from monet_opt.attributes import SideEffectWarning
from monet_opt.autocast_backward import AutocastBackwardWarning
from monet_opt.eval_steps import UnplannedStepWarning
from monet_opt.errors import (CaptureError, DoubleBackwardError, InfeasibleBudgetError,
                              MonetError, NoBackwardError, PlanMismatchError,
                              UnsupportedGraphError)
from monet_opt.held_outputs import OutputsHeldWarning
from monet_opt.hooks import HookWarning
from monet_opt.in_flight import StepsInFlightWarning
from monet_opt.batch_size import BatchFit, largest_batch
from monet_opt.cache_files import ProfileCacheWarning
from monet_opt.memory import LiveBytes, measure_peak, resident_tensors
from monet_opt.module import OptimizedModule, ReplanWarning
from monet_opt.output_grad import OutputGradientWarning, TransformWarning, WithLoss
from monet_opt.plan import Plan
from monet_opt.profiler import ProfileTimeLimitWarning
from monet_opt.retained_graphs import RetainedGraphWarning
from monet_opt.units import Share, format_bytes, parse_memory_limit
from monet_opt.variants_bn import BatchNormScaleError

__all__ = ["AccumulationWarning", "AutocastBackwardWarning", "BatchFit", "BatchNormScaleError",
           "CaptureError", "DoubleBackwardError", "HookWarning", "InfeasibleBudgetError",
           "LiveBytes", "MonetError", "NoBackwardError", "OptimizedModule",
           "OutputGradientWarning", "OutputsHeldWarning", "Plan", "PlanMismatchError",
           "ProfileCacheWarning", "ProfileTimeLimitWarning", "ReplanWarning",
           "RetainedGraphWarning", "Share", "SideEffectWarning", "StepsInFlightWarning",
           "TransformWarning", "UnplannedStepWarning", "UnsupportedGraphError", "WithLoss",
           "format_bytes", "largest_batch", "lower_problem", "measure_peak", "optimize",
           "parse_memory_limit", "resident_tensors"]
