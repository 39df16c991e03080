"""Turn a recorded episode (an .mp4 of `--capture-video`) into a GIF that a README can show.

    python ppo_atari.py --eval-checkpoint runs/<run_name>/checkpoint.pt --eval-episodes 3 --capture-video
    python tools/gif.py videos/<run_name>-eval-<unix time>/rl-video-episode-1.mp4 breakout.gif --every 4

Every `--every`-th frame is kept and played at the video's own frame rate, so the GIF runs `--every` times faster
than the game (Atari videos hold every emulator frame: 4 per agent step). `--max-frames` cuts it short.
"""

import argparse
import os
import sys
from pathlib import Path

from _common import exit_with


def video_to_gif(video, gif, every=4, max_frames=None):
    """Write every `every`-th frame of `video` (up to `max_frames` of them) to `gif`; return the number written."""
    import imageio.v2 as imageio
    from moviepy import VideoFileClip

    clip = VideoFileClip(str(video))
    try:
        fps = clip.fps
        frames = []
        for i, frame in enumerate(clip.iter_frames()):
            if i % every == 0:
                frames.append(frame)
                if max_frames is not None and len(frames) >= max_frames:
                    break
    finally:
        clip.close()
    if not frames:
        raise ValueError(f"{video} holds no frames")
    tmp = Path(gif).with_name(f".{Path(gif).stem}.tmp{os.getpid()}.gif")  # whole or not at all (a full disk, ...)
    try:
        imageio.mimsave(str(tmp), frames, duration=1000 / fps, loop=0)
        os.replace(tmp, gif)
    finally:
        tmp.unlink(missing_ok=True)
    return len(frames)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("video", type=Path, help="an .mp4 written by --capture-video")
    parser.add_argument("gif", type=Path, help="the GIF to write")
    parser.add_argument("--every", type=int, default=4, help="keep every this many frames (default 4)")
    parser.add_argument("--max-frames", type=int, default=None, help="at most this many frames in the GIF")
    opts = parser.parse_args(argv)
    if not opts.video.is_file():
        sys.exit(f"error: {opts.video} is not a file; give an .mp4 from videos/<run_name>/")
    if opts.every < 1 or (opts.max_frames is not None and opts.max_frames < 1):
        sys.exit("error: --every and --max-frames must be at least 1")
    if opts.gif.suffix.lower() != ".gif":
        sys.exit(f"error: {opts.gif} does not end in .gif; name the GIF to write, e.g. breakout.gif")
    if opts.gif.is_dir() or not opts.gif.parent.is_dir():
        where = f"{opts.gif} is a folder" if opts.gif.is_dir() else f"{opts.gif.parent} is not a folder"
        sys.exit(f"error: {where}; give the path of the GIF to write, in a folder that exists")
    try:
        n = video_to_gif(opts.video, opts.gif, opts.every, opts.max_frames)
    except (OSError, ValueError) as e:  # ffmpeg's message runs over many lines: its last one says why
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        sys.exit(f"error: cannot make a GIF of {opts.video}: {reason}")
    print(f"wrote {opts.gif}: {n} frames, {opts.gif.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    exit_with(main)
