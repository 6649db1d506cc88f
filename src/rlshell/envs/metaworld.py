"""MetaWorld's Sawyer-arm tasks from state or a camera, on a CPU (env type ``metaworld``).

``env.env_id`` names the tasks (`task_names`):

- one task, MetaWorld's MT1: ``"reach-v3"`` (also ``"Meta-World/MT1/reach-v3"``),
  any of the 50 in `TASK_DESCRIPTIONS`;
- a task set, ``"MT10"``, ``"MT25"`` or ``"MT50"`` (also ``"Meta-World/MT10"``):
  ``env.num_envs`` must be a multiple of the set's size k, and copy i runs
  task ⌊i·k / num_envs⌋ of the set in MetaWorld's order, num_envs / k
  consecutive copies per task, so a group of envs that reset alike
  (`EnvStepper.reset` with a group size dividing num_envs / k) plays one task.

Every reset draws new object and goal positions from the task's range, with
the copy's generator, which ``reset(seed=s)`` seeds: the same seed, the same
start. That is MetaWorld's own seeded mode (``seeded_rand_vec``, the goal
observed as in its MT benchmarks), not the 50 positions per task its
benchmark classes fix in advance by resetting each task 50 times (slow to
build for a task set, in every env process). An episode ends only by
truncation, after ``env.max_episode_steps`` steps (null: MetaWorld's 500); a
success does not end it. ``info["success"]`` (1.0 or 0.0 at every step)
gives `EnvStepper` its success metrics. The copies step in the worker's
process (gymnasium's ``SyncVectorEnv``: a MuJoCo step costs less than a
pipe's round trip to another process) and reset in the step they finish
(``SAME_STEP``: the final observation is in ``info["final_obs"]``).

Observations (``env.obs_mode``):

- ``state`` (null): MetaWorld's 39 numbers: the hand's position and the
  gripper's opening, the objects' positions and quaternions (14, zero-padded),
  the same 18 one step before, and the goal's position.
- ``rgb``: MetaWorld's camera ``corner4`` (the arm and the table from a
  corner above them) as ``main_images``, uint8 ``[S, S, 3]`` with S =
  ``env.image_size`` (null: 128); what the robot knows of itself as
  ``states`` (the hand's position and the gripper's opening, now and one
  step before: 8 numbers, no object or goal); the task in words as
  ``task_descriptions``.

Images are drawn plainly (no shadows, reflections or multisampling: in
software that is several times faster, and the same picture whatever draws
it) with the OpenGL `rlshell.envs.osmesa.use_osmesa` selects before MuJoCo
starts: OSMesa on a CPU. ``render_mode="rgb_array"`` makes ``render()``
return `RENDER_SIZE`-pixel frames of the same camera (evaluation GIFs).
A machine without ``metaworld`` (or without OpenGL, for a camera) gets one
sentence, `MetaWorldUnavailableError`. ``metaworld`` is imported only here,
and only when an env is built.
"""

from __future__ import annotations

import atexit
import ctypes
import difflib
import functools
import importlib
import importlib.util
import os
import string
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np
from jaxtyping import UInt8

from rlshell.config import EnvConfig
from rlshell.envs.osmesa import use_osmesa

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

__all__ = [
    "CAMERA",
    "OBS_MODES",
    "RENDER_SIZE",
    "TASK_DESCRIPTIONS",
    "TASK_SETS",
    "CameraRenderer",
    "MetaWorldUnavailableError",
    "make_metaworld_env",
    "metaworld_unavailable_reason",
    "task_description",
    "task_names",
]

OBS_MODES = ("state", "rgb")
TASK_SETS = ("MT10", "MT25", "MT50")
CAMERA = "corner4"
DEFAULT_IMAGE_SIZE = 128
RENDER_SIZE = 256
# MetaWorld's observation: [hand xyz, gripper opening, objects (14)] now, the same one step
# before, then the goal xyz.
_PROPRIO = np.r_[0:4, 18:22]
_GOAL = slice(36, 39)
# What the camera observations carry as task_descriptions: MetaWorld's own description of each
# task (docs/benchmark/task_descriptions.md in its repository), the first sentence.
TASK_DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "pick up a nut and place it onto a peg",
    "basketball-v3": "dunk the basketball into the basket",
    "bin-picking-v3": "grasp the puck from one bin and place it into another bin",
    "box-close-v3": "grasp the cover and close the box with it",
    "button-press-topdown-v3": "press a button from the top",
    "button-press-topdown-wall-v3": "bypass a wall and press a button from the top",
    "button-press-v3": "press a button",
    "button-press-wall-v3": "bypass a wall and press a button",
    "coffee-button-v3": "push a button on the coffee machine",
    "coffee-pull-v3": "pull a mug from a coffee machine",
    "coffee-push-v3": "push a mug under a coffee machine",
    "dial-turn-v3": "rotate a dial 180 degrees",
    "disassemble-v3": "pick a nut out of a peg",
    "door-close-v3": "close a door with a revolving joint",
    "door-lock-v3": "lock the door by rotating the lock clockwise",
    "door-open-v3": "open a door with a revolving joint",
    "door-unlock-v3": "unlock the door by rotating the lock counter-clockwise",
    "hand-insert-v3": "insert the gripper into a hole",
    "drawer-close-v3": "push and close a drawer",
    "drawer-open-v3": "open a drawer",
    "faucet-open-v3": "rotate the faucet counter-clockwise",
    "faucet-close-v3": "rotate the faucet clockwise",
    "hammer-v3": "hammer a screw on the wall",
    "handle-press-side-v3": "press a handle down sideways",
    "handle-press-v3": "press a handle down",
    "handle-pull-side-v3": "pull a handle up sideways",
    "handle-pull-v3": "pull a handle up",
    "lever-pull-v3": "pull a lever down 90 degrees",
    "pick-place-wall-v3": "pick a puck, bypass a wall and place the puck",
    "pick-out-of-hole-v3": "pick up a puck from a hole",
    "pick-place-v3": "pick and place a puck to a goal",
    "plate-slide-v3": "slide a plate into a cabinet",
    "plate-slide-side-v3": "slide a plate into a cabinet sideways",
    "plate-slide-back-v3": "get a plate from the cabinet",
    "plate-slide-back-side-v3": "get a plate from the cabinet sideways",
    "peg-insert-side-v3": "insert a peg sideways",
    "peg-unplug-side-v3": "unplug a peg sideways",
    "soccer-v3": "kick a soccer ball into the goal",
    "stick-push-v3": "grasp a stick and push a box using the stick",
    "stick-pull-v3": "grasp a stick and pull a box with the stick",
    "push-v3": "push the puck to a goal",
    "push-wall-v3": "bypass a wall and push a puck to a goal",
    "push-back-v3": "pull a puck to a goal",
    "reach-v3": "reach a goal position",
    "reach-wall-v3": "bypass a wall and reach a goal",
    "shelf-place-v3": "pick and place a puck onto a shelf",
    "sweep-into-v3": "sweep a puck into a hole",
    "sweep-v3": "sweep a puck off the table",
    "window-open-v3": "push and open a window",
    "window-close-v3": "push and close a window",
}
# MuJoCo's off-screen OpenGL contexts, by MUJOCO_GL (MuJoCo's own default: GLFW).
_GL_CONTEXTS = {"osmesa": "mujoco.osmesa", "egl": "mujoco.egl", "glfw": "mujoco.glfw"}

Image = UInt8[np.ndarray, "size size 3"]


class MetaWorldUnavailableError(RuntimeError):
    """MetaWorld cannot run on this machine (no metaworld, or no OpenGL for its camera)."""


def metaworld_unavailable_reason(cameras: bool = False) -> str | None:
    """Why MetaWorld envs (with a camera if ``cameras``) cannot run here, or None.

    With ``cameras``, selects MuJoCo's OpenGL for this process as a side effect (`use_osmesa`).
    """
    if importlib.util.find_spec("metaworld") is None:
        return (
            "metaworld is not installed (`make install` installs it: "
            "pip install --no-deps metaworld==3.1.1)"
        )
    if cameras:
        choice = use_osmesa()
        if choice.kind == "none":
            return choice.detail
    return None


def task_description(name: str) -> str:
    """The task in words: `TASK_DESCRIPTIONS`, else the name's words (``reach-v3``: reach)."""
    if name in TASK_DESCRIPTIONS:
        return TASK_DESCRIPTIONS[name]
    return name.rsplit("-v", 1)[0].replace("-", " ")


def task_names(env_id: str | None) -> tuple[str, ...]:
    """The MetaWorld tasks ``env_id`` names, a set's in MetaWorld's order.

    Raises a ValueError naming ``env.env_id`` and the closest ids for an unknown one.
    """
    if not env_id:
        raise ValueError(
            "env.env_id: name a MetaWorld task (e.g. 'reach-v3') or task set "
            f"({', '.join(repr(name) for name in TASK_SETS)})"
        )
    env_dict = importlib.import_module("metaworld.env_dict")
    sets = {name: tuple(getattr(env_dict, f"{name}_V3")) for name in TASK_SETS}
    name = env_id.removeprefix("Meta-World/").removeprefix("MT1/")
    if name in sets:
        return sets[name]
    if name in env_dict.ALL_V3_ENVIRONMENTS:
        return (name,)
    known = [*sets, *env_dict.ALL_V3_ENVIRONMENTS]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    raise ValueError(
        f"env.env_id: unknown MetaWorld task {env_id!r}{hint}; name one of its 50 tasks "
        f"(e.g. 'reach-v3') or a task set ({', '.join(repr(s) for s in TASK_SETS)})"
    )


def _unavailable(cfg: EnvConfig, reason: str) -> MetaWorldUnavailableError:
    return MetaWorldUnavailableError(
        f"env type 'metaworld' ({cfg.env_id or 'no env.env_id'}) cannot run on this machine: "
        f"{reason}"
    )


def make_metaworld_env(cfg: EnvConfig, seed: int = 0, render_mode: str | None = None) -> VectorEnv:
    """``cfg.num_envs`` copies of the MetaWorld tasks ``cfg.env_id`` names, reset with ``seed``.

    Copy i of a task set runs task ⌊i·k / num_envs⌋ of its k (the module
    docstring); ``render_mode="rgb_array"`` makes ``render()`` return frames of
    the camera (`RENDER_SIZE` pixels a side).
    """
    obs_mode = cfg.obs_mode or "state"
    if obs_mode not in OBS_MODES:
        raise ValueError(
            f"env.obs_mode: the 'metaworld' env type observes {' or '.join(OBS_MODES)}, "
            f"got {cfg.obs_mode!r}"
        )
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode: MetaWorld renders 'rgb_array' frames, got {render_mode!r}")
    reason = metaworld_unavailable_reason(cameras=obs_mode == "rgb" or render_mode is not None)
    if reason is not None:
        raise _unavailable(cfg, reason)
    names = task_names(cfg.env_id)
    if cfg.num_envs % len(names) != 0:
        raise ValueError(
            f"env.num_envs: {cfg.env_id} spreads its copies evenly over its {len(names)} tasks: "
            f"expected a multiple of {len(names)}, got {cfg.num_envs}"
        )
    per_task = cfg.num_envs // len(names)
    text_length = max(len(task_description(name)) for name in names)
    copies = [
        functools.partial(
            _task_env,
            name,
            max_episode_steps=cfg.max_episode_steps,
            obs_mode=obs_mode,
            image_size=cfg.image_size or DEFAULT_IMAGE_SIZE,
            text_length=text_length,
            render_mode=render_mode,
        )
        for name in names
        for _ in range(per_task)
    ]
    env = gymnasium.vector.SyncVectorEnv(
        copies, autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP
    )
    env.reset(seed=seed)  # copy i gets seed + i
    return env


def _task_env(
    name: str,
    *,
    max_episode_steps: int | None,
    obs_mode: str,
    image_size: int,
    text_length: int,
    render_mode: str | None,
) -> gymnasium.Env[Any, Any]:
    """One copy of task ``name``, observed as ``obs_mode`` says."""
    env_dict = importlib.import_module("metaworld.env_dict")
    sawyer = env_dict.ALL_V3_ENVIRONMENTS[name]()
    if max_episode_steps is not None:
        # MetaWorld truncates at its own max_path_length (and refuses a step past it).
        sawyer.max_path_length = max_episode_steps
    env: gymnasium.Env[Any, Any] = SeededVariations(sawyer)
    if obs_mode == "rgb":
        camera = CameraRenderer(sawyer.model, sawyer.data, CAMERA, image_size)
        env = CameraObservation(env, camera, task_description(name), text_length)
    if render_mode is not None:
        env = CameraFrames(env, CAMERA, RENDER_SIZE)
    return env


class SeededVariations(gymnasium.Wrapper[Any, Any, Any, Any]):
    """A MetaWorld task that draws new object and goal positions at every reset, goal observed.

    The draw is MetaWorld's seeded one (``seeded_rand_vec``: the env's
    generator, over the task's ``_random_reset_space``), set up as its
    goal-observable classes do (``metaworld.env_dict``); ``reset(seed=s)``
    seeds the generator (MetaWorld's own ``reset`` ignores its seed; ``seed()``
    is its way). The observation space leaves the goal's bounds open: they
    differ between tasks, and the copies of a task set share one space.
    """

    def __init__(self, sawyer: Any) -> None:
        super().__init__(sawyer)
        sawyer._partially_observable = False
        sawyer.__dict__.pop("sawyer_observation_space", None)  # cached with the goal hidden
        sawyer._set_task_called = True
        sawyer._freeze_rand_vec = False
        sawyer.seeded_rand_vec = True
        space = sawyer.sawyer_observation_space
        low, high = space.low.copy(), space.high.copy()
        low[_GOAL], high[_GOAL] = -np.inf, np.inf
        self.observation_space = gymnasium.spaces.Box(low, high, dtype=np.float64)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self.env.unwrapped.seed(seed)  # type: ignore[attr-defined]
        return self.env.reset(options=options)


@functools.cache
def _gl_context(backend: str) -> Any:
    """This process's OpenGL context for ``backend`` (a ``MUJOCO_GL`` value), made once.

    Every camera draws in it, each into a framebuffer of its own (its
    ``MjrContext``): a context per camera would cost each copy its own
    compilation of llvmpipe's shaders in software.
    """
    if backend not in _GL_CONTEXTS:
        raise ValueError(
            f"MUJOCO_GL={backend!r}: MuJoCo draws off-screen with {', '.join(_GL_CONTEXTS)}"
        )
    context = importlib.import_module(_GL_CONTEXTS[backend]).GLContext(1, 1)
    atexit.register(_free_at_exit, context)
    return context


def _free_at_exit(context: Any) -> None:
    """Free the process's context while MuJoCo's OpenGL modules are still loaded. Its own
    ``__del__`` would free it again during the interpreter's teardown, after those modules
    are gone, and print an ignored ``AttributeError`` at the exit of every camera process:
    the freed context is kept alive past the teardown instead."""
    context.free()
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(context))


class CameraRenderer:
    """Frames of one MuJoCo camera, ``[size, size, 3]`` uint8, drawn off-screen.

    Drawn plainly (no shadows, reflections or multisampling) with the OpenGL
    ``MUJOCO_GL`` names when the renderer is made (`rlshell.envs.osmesa`), in
    the process's one context (`_gl_context`). A camera whose up axis points
    down in the world (MetaWorld's corner cameras) would give an upside-down
    picture: its frames are turned by 180°.
    """

    def __init__(self, model: Any, data: Any, camera: str, size: int) -> None:
        mujoco = importlib.import_module("mujoco")
        camera_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if camera_id < 0:
            raise ValueError(f"the MuJoCo model has no camera {camera!r}")
        self.model, self.data, self.size = model, data, size
        # Read when the context is made: no multisampling, no shadow map, a buffer of the
        # frame's size (MetaWorld's 4 samples, 4096² shadow map and 640×480 buffer are slow
        # for a software renderer to set up for each copy).
        model.vis.quality.offsamples = 0
        model.vis.quality.shadowsize = 0
        model.vis.global_.offwidth = model.vis.global_.offheight = size
        self._gl = _gl_context(os.environ.get("MUJOCO_GL", "").lower() or "glfw")
        self._gl.make_current()
        self._context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_50)  # no text
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._context)
        self._scene = mujoco.MjvScene(model, maxgeom=1000)
        self._scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._option = mujoco.MjvOption()
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._camera.fixedcamid = camera_id
        self._viewport = mujoco.MjrRect(0, 0, size, size)
        mujoco.mj_forward(model, data)
        self._upside_down = bool(data.cam_xmat[camera_id].reshape(3, 3)[2, 1] < 0)
        self._mujoco = mujoco

    def frame(self) -> Image:
        """The camera's view of the model's current state."""
        mujoco = self._mujoco
        self._gl.make_current()
        mujoco.mjv_updateScene(
            self.model,
            self.data,
            self._option,
            None,
            self._camera,
            mujoco.mjtCatBit.mjCAT_ALL,
            self._scene,
        )
        mujoco.mjr_render(self._viewport, self._scene, self._context)
        pixels = np.empty((self.size, self.size, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(pixels, None, self._viewport, self._context)
        # OpenGL's rows run bottom-up; turned by 180°, only its columns are reversed.
        image: Image = np.ascontiguousarray(pixels[:, ::-1] if self._upside_down else pixels[::-1])
        return image

    def close(self) -> None:
        """Free the camera's framebuffer and textures (it cannot draw afterwards)."""
        self._gl.make_current()
        self._context.free()


class CameraObservation(gymnasium.ObservationWrapper[Any, Any, Any]):
    """``{"main_images", "states", "task_descriptions"}`` in place of MetaWorld's 39 numbers."""

    def __init__(
        self, env: gymnasium.Env[Any, Any], camera: CameraRenderer, task: str, text_length: int
    ) -> None:
        super().__init__(env)
        self.camera, self.task = camera, task
        inner = env.observation_space
        assert isinstance(inner, gymnasium.spaces.Box)
        size = camera.size
        self.observation_space = gymnasium.spaces.Dict(
            {
                "main_images": gymnasium.spaces.Box(0, 255, (size, size, 3), np.uint8),
                "states": gymnasium.spaces.Box(
                    inner.low[_PROPRIO], inner.high[_PROPRIO], dtype=np.float64
                ),
                "task_descriptions": gymnasium.spaces.Text(
                    max_length=text_length, min_length=0, charset=string.printable
                ),
            }
        )

    def observation(self, observation: np.ndarray[Any, Any]) -> dict[str, Any]:
        return {
            "main_images": self.camera.frame(),
            "states": observation[_PROPRIO],
            "task_descriptions": self.task,
        }

    def close(self) -> None:
        self.camera.close()
        super().close()


class CameraFrames(gymnasium.Wrapper[Any, Any, Any, Any]):
    """``render()`` returns frames of a camera (``render_mode`` ``"rgb_array"``), made at the
    first call."""

    render_mode = "rgb_array"

    def __init__(self, env: gymnasium.Env[Any, Any], camera: str, size: int) -> None:
        super().__init__(env)
        self.camera_name, self.size = camera, size
        self.camera: CameraRenderer | None = None

    def render(self) -> Image:
        if self.camera is None:
            sawyer: Any = self.env.unwrapped
            self.camera = CameraRenderer(sawyer.model, sawyer.data, self.camera_name, self.size)
        return self.camera.frame()

    def close(self) -> None:
        if self.camera is not None:
            self.camera.close()
        super().close()
