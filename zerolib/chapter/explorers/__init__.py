"""Live explorers for the notebooks: ipywidgets controls that redraw the chapter's figures in
place (see :mod:`zerolib.chapter.explorers.base`)."""
from zerolib.chapter.explorers.gpu_count import GpuCountExplorer
from zerolib.chapter.explorers.model_size import ModelSizeExplorer
from zerolib.chapter.explorers.placement import PlacementExplorer
from zerolib.chapter.explorers.planner import PlannerExplorer
from zerolib.chapter.explorers.shards import ShardExplorer
from zerolib.chapter.explorers.step_time import StepTimeExplorer
from zerolib.chapter.explorers.will_it_fit import WillItFitExplorer

__all__ = ["GpuCountExplorer", "ModelSizeExplorer", "PlacementExplorer", "PlannerExplorer",
           "ShardExplorer", "StepTimeExplorer", "WillItFitExplorer"]
