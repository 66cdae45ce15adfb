"""The response parser: sections and the final code block, whatever shape the response has."""

from speedforge.policy.parser import CODE, parse_response

CODE_A = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()"


def test_well_formed_response():
    text = f"""Some preamble the model wrote.

### Performance Analysis
Variant 2 is fastest: it fuses the add and the relu.

### Algorithm Design
Fuse all three ops into one pass.

### Code Implementation
```python
{CODE_A}
```
"""
    parsed = parse_response(text)
    assert parsed.analysis == "Variant 2 is fastest: it fuses the add and the relu."
    assert parsed.design == "Fuse all three ops into one pass."
    assert parsed.code == CODE_A
    assert parsed.complete and parsed.missing == () and parsed.notes == ()


def test_heading_styles_bold_numbered_and_inline_text():
    text = f"""**Performance Analysis:** memory bound.
1. Algorithm Design: one loop.
## 3) Code Implementation
```py
{CODE_A}
```"""
    parsed = parse_response(text)
    assert parsed.analysis == "memory bound."
    assert parsed.design == "one loop."
    assert parsed.code == CODE_A
    assert parsed.complete


def test_prose_that_starts_with_a_section_name_is_not_a_heading():
    text = "Performance analysis shows nothing.\n```python\n" + CODE_A + "\n```"
    parsed = parse_response(text)
    assert parsed.analysis == ""
    assert parsed.missing == ("Performance Analysis", "Algorithm Design")
    assert parsed.code == CODE_A


def test_final_code_block_wins_and_prefers_one_defining_the_marker():
    text = f"""### Code Implementation
```python
class Draft: pass
```
```python
{CODE_A}
```
Usage:
```python
print(ModelNew()(x))  # example
```
```bash
python run.py
```"""
    assert parse_response(text).code == CODE_A  # not the usage example after it, which only calls ModelNew
    text2 = text.replace("print(ModelNew()(x))  # example", "print('hi')")
    assert parse_response(text2).code == CODE_A
    assert parse_response(text2, marker="").code == "print('hi')"


def test_a_block_that_only_uses_the_marker_never_wins_over_the_one_defining_it():
    cuda = 'cuda_src = """__global__ void k(float* x) {}"""'
    text = f"""### Code Implementation
```cuda
// the kernel ModelNew launches
__global__ void k(float* x) {{}}
```
```cuda
{CODE_A}
```
```python
model = ModelNew(*get_init_inputs())
out = model(*get_inputs())
```"""
    assert parse_response(text).code == CODE_A  # defined in a block tagged cuda: still the program
    fenced = f"```python\n{cuda}\n{CODE_A}\n```\n```python\nprint(ModelNew)\n```\n```python\nx = 1\n```"
    assert parse_response(fenced).code == f"{cuda}\n{CODE_A}"
    assert parse_response("```python\nprint(ModelNew)\n```\n```python\nx = 1\n```").code == "print(ModelNew)"


def test_headings_inside_code_blocks_are_code():
    text = f"""## Performance Analysis
slow.
## Algorithm Design
fast.
## Code Implementation
```python
# Performance analysis: this comment is code
{CODE_A}
```"""
    parsed = parse_response(text)
    assert parsed.code.startswith("# Performance analysis: this comment is code")
    assert parsed.analysis == "slow."


def test_unclosed_fence_from_a_cut_off_response():
    text = f"## Performance Analysis\nslow\n## Algorithm Design\nfuse\n## Code Implementation\n```python\n{CODE_A}\n    # and then the token limit"
    parsed = parse_response(text)
    assert parsed.code.startswith(CODE_A)
    assert parsed.complete
    assert any("not closed" in n for n in parsed.notes)


def test_code_without_fences():
    text = f"Performance Analysis: slow.\nAlgorithm Design: fuse.\nCode Implementation:\nHere it is.\n{CODE_A}\n"
    parsed = parse_response(text)
    assert parsed.code == CODE_A
    assert parsed.analysis == "slow." and parsed.design == "fuse."
    assert parsed.notes == ("code found without a fence",)


def test_missing_everything_is_reported():
    for text in ("", "I am not sure how to do this.", None):
        parsed = parse_response(text)
        assert parsed.code == ""
        assert parsed.missing == ("Performance Analysis", "Algorithm Design", "Code Implementation", CODE)
        assert not parsed.complete
        assert parsed.describe_missing().startswith("missing: Performance Analysis")


def test_code_that_lacks_the_marker_is_noted():
    parsed = parse_response("```python\nimport torch\nx = 1\n```")
    assert parsed.code == "import torch\nx = 1"
    assert "the code does not mention ModelNew" in parsed.notes


def test_empty_repeated_heading_does_not_erase_the_section():
    text = (
        "### Performance Analysis\nreal analysis\n### Performance Analysis\n### Algorithm Design\nplan\n```python\n"
        + CODE_A
        + "\n```"
    )
    parsed = parse_response(text)
    assert parsed.analysis == "real analysis"
    assert parsed.design.startswith("plan")


def test_cpp_language_for_the_ann_family():
    cpp = "#include <vector>\nint search(const float* q) { return 0; }"
    text = f"### Code Implementation\n```python\nprint('not this')\n```\n```cpp\n{cpp}\n```"
    assert parse_response(text, language="cpp", marker="").code == cpp
    assert parse_response(f"Code Implementation:\n{cpp}", language="cpp", marker="").code == cpp


def test_windows_line_endings_and_tildes():
    text = "### Performance Analysis\r\nok\r\n~~~python\r\n" + CODE_A.replace("\n", "\r\n") + "\r\n~~~\r\n"
    parsed = parse_response(text)
    assert parsed.code == CODE_A
    assert parsed.analysis.startswith("ok")
