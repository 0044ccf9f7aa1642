from .ir import (
    SCM,
    AllocPlan,
    AllocStep,
    LaunchPlan,
    LaunchStep,
    Param,
    RegionInput,
    RegionProgram,
    Specialization,
    TensorFacts,
    TensorGuard,
    ValueRef,
)
from .printer import format_scm

__all__ = [
    "SCM",
    "AllocPlan",
    "AllocStep",
    "LaunchPlan",
    "LaunchStep",
    "Param",
    "RegionInput",
    "RegionProgram",
    "Specialization",
    "TensorFacts",
    "TensorGuard",
    "ValueRef",
    "format_scm",
]
