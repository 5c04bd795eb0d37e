"""The stored conversation as the engine's turns: pictures of earlier messages the engine
cannot take are left out (app/model/history.py), the question just asked keeps its own."""

from PIL import Image

from merlin.app.model.history import without_refused_images
from merlin.app.model.prompting import Turn
from merlin.engine.vision.budget import BudgetedImage


def test_earlier_pictures_the_engine_refuses_are_left_out(tmp_path):
    good, cut, strip = tmp_path / "good.png", tmp_path / "cut.jpg", tmp_path / "strip.png"
    Image.new("RGB", (64, 64), (200, 10, 10)).save(good)
    Image.radial_gradient("L").convert("RGB").save(cut, quality=95)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    Image.new("RGB", (1000, 4), (0, 0, 255)).save(strip)
    turns = [
        Turn("user", "look", [str(good), str(cut), BudgetedImage(str(strip), 64)]),
        Turn("assistant", "ok"),
        Turn("user", "again", [str(strip)]),  # asked now: as it is (the engine says why)
    ]
    kept, refused = without_refused_images(turns)
    assert refused == [str(cut), str(strip)]
    assert kept[0].images == [str(good)] and kept[0].text == "look"
    assert kept[1] is turns[1] and kept[2] is turns[2]
    # the verdict follows the file: the same path fixed (another size or time) is taken again
    Image.new("RGB", (64, 64)).save(strip)
    assert without_refused_images(turns)[1] == [str(cut)]
