"""The notebooks execute headless (nbclient) so that they cannot rot. Needs the
``[notebooks]`` extra; skipped without it."""

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_four_notebooks_stored_without_outputs():
    import json

    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"]
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code"), path.name


#: 04_validation runs policies in the reference runtime against their predictions (a cross-check);
#: 03_policy_map searches a grid of policies for its map (about 30 s on 2 cores)
SLOW_NOTEBOOKS = ("03_policy_map.ipynb", "04_validation.ipynb")


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_NOTEBOOKS else p
                                  for p in NOTEBOOKS], ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    images = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
