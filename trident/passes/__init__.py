from .cse import eliminate_common_subexpressions
from .decompose_functional_launches import decompose_functional_launches
from .outline_regions import outline_regions, region_program
from .partition_regions import Partition, Region, partition_regions
from .sink_allocations import drop_unused_projections, sink_allocations

__all__ = [
    "Partition",
    "Region",
    "decompose_functional_launches",
    "drop_unused_projections",
    "eliminate_common_subexpressions",
    "outline_regions",
    "partition_regions",
    "region_program",
    "sink_allocations",
]
