"""MP4 files of played episodes, written and read back with imageio and its ffmpeg plugin (dependencies of the
package: ``imageio-ffmpeg``'s wheel carries ffmpeg itself). A video is written under a temporary name beside its target and
renamed once complete, so a file with the name asked for is always a whole video."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mpirl import atomic
from mpirl.config import ConfigError


def _ffmpeg():
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg
    except ImportError as err:
        raise ConfigError("--video", f"writing MP4 needs imageio with its ffmpeg plugin ({err}); install them with "
                                     "pip install imageio imageio-ffmpeg") from None
    return imageio, imageio_ffmpeg


def check_target(path: Path, force: bool) -> None:
    """Refuse a video that cannot be written (:func:`mpirl.atomic.check_target`: not .mp4, a directory, a parent
    missing or unwritable, a file that exists without ``force``), and a missing ffmpeg."""
    _ffmpeg()
    atomic.check_target("--video", path, force, (".mp4",))


class VideoFile:
    """Frames appended one at a time (``(H, W, 3)`` uint8, all of one size), H.264 at ``fps``; :meth:`close` renames
    the complete file into place, :meth:`discard` removes it."""

    def __init__(self, path: Path, fps: float):
        imageio, _ = _ffmpeg()
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.stem}.partial-{os.getpid()}.mp4")
        # macro_block_size 2: H.264's 4:2:0 needs even sides; an odd side is padded by one pixel, not resized.
        self.writer = imageio.get_writer(self.tmp, fps=fps, codec="libx264", quality=7, macro_block_size=2,
                                         ffmpeg_log_level="error")
        self.frames = 0
        self.size: tuple[int, int] | None = None

    def add(self, frame: np.ndarray) -> None:
        if self.size is None:
            self.size = frame.shape[:2]
        elif frame.shape[:2] != self.size:
            raise ValueError(f"frame {self.frames} is {frame.shape[:2]}, the video's are {self.size}")
        self.writer.append_data(frame)
        self.frames += 1

    def close(self) -> None:
        self.writer.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        try:
            self.writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)


def count_frames(path: Path) -> int:
    """The frames an MP4 holds, as ffmpeg decodes them."""
    _, imageio_ffmpeg = _ffmpeg()
    return int(imageio_ffmpeg.count_frames_and_secs(str(path))[0])
