"""Only here to ship ``bridge_freeze_plugin.pth`` at the top of site-packages (all metadata is in
pyproject.toml). Python runs that one line at start-up: installing the plugin activates it."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "bridge_freeze_plugin.pth"


class build_py_with_pth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(Path(__file__).parent / PTH), str(Path(self.build_lib) / PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": build_py_with_pth})
