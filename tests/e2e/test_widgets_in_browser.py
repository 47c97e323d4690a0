"""Open the notebooks in JupyterLab in a real browser, run them down to a widget as a learner would, move its
controls, see the figure change. (Every cell of every notebook also runs under nbval, in a kernel without a browser:
the cells after the widget are checked there, so the browser stops at the widget.)"""
import pytest

pytestmark = pytest.mark.e2e

ERRORS = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'], .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']"


def open_and_run_down_to(page, lab, notebook: str, code: str) -> None:
    """Open a notebook, start its kernel and run its cells from the top down to the first one whose source holds
    `code` (the widget's cell), with JupyterLab's own "run all above" and "run cell"; wait until they have finished."""
    page.goto(f"{lab['base']}/lab/tree/{notebook}?token={lab['token']}")
    page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')", timeout=120_000)
    dialog = page.locator(".jp-Dialog button.jp-mod-accept")        # "Select Kernel": take the notebook's own
    try:
        dialog.click(timeout=15_000)
    except Exception:
        pass
    page.wait_for_function("[...document.querySelectorAll('.jp-Notebook-ExecutionIndicator')]"
                           ".some(e => e.dataset.status === 'idle')", timeout=120_000)     # the kernel is ready
    last = page.evaluate("""async (code) => {
        const app = window.jupyterapp, notebook = app.shell.currentWidget.content;
        const last = notebook.widgets.findIndex(c => c.model.sharedModel.getSource().includes(code));
        if (last < 0) return last;
        notebook.activeCellIndex = last;
        await app.commands.execute('notebook:run-all-above');
        await app.commands.execute('notebook:run-cell');
        return last; }""", code)
    assert last >= 0, f"no cell of {notebook} holds {code!r}"
    page.wait_for_function(
        """(last) => { const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')].slice(0, last + 1);
                       const p = cells.filter(c => c.classList.contains('jp-CodeCell'))
                                      .map(c => c.querySelector('.jp-InputArea-prompt'));
                       return p.length > 0 && p.every(e => /\\[\\d+\\]/.test(e.textContent)); }""",
        arg=last, timeout=600_000)


def widget_cell(page, label: str):
    """The output area holding a widget whose control is labelled `label`."""
    cell = page.locator(".jp-OutputArea-output").filter(has=page.locator(f".widget-label:text-is('{label}')")).first
    cell.scroll_into_view_if_needed()
    cell.locator(".widget-output img").first.wait_for(timeout=120_000)
    return cell


def figure(cell) -> str:
    return cell.locator(".widget-output img").first.get_attribute("src")


def wait_for_new_figure(page, cell, before: str, quiet_ms: int = 2000) -> str:
    """The figure once it differs from `before` and has stopped changing.

    Every arrow-key press commits a slider value and the kernel redraws for each, one after another: the first new
    figure is only an intermediate one. So wait until no new figure has come for `quiet_ms`.
    """
    handle = cell.element_handle()
    page.wait_for_function("([c, b]) => { const i = c.querySelector('.widget-output img'); return i && i.src !== b; }",
                           arg=[handle, before], timeout=120_000)
    last = None
    while (current := figure(cell)) != last:
        last = current
        page.wait_for_timeout(quiet_ms)
    return current


def readout(page, cell, label: str) -> str:
    """The value shown next to the slider labelled `label`."""
    slider = cell.locator(".widget-slider").filter(has=page.locator(f".widget-label:text-is('{label}')")).first
    return slider.locator(".widget-readout").first.inner_text()


def move_slider(page, cell, label: str, presses: int, key: str = "ArrowRight") -> str:
    """Move the slider labelled `label` with the keyboard, as a learner would with arrow keys; return its readout."""
    slider = cell.locator(".widget-slider").filter(has=page.locator(f".widget-label:text-is('{label}')")).first
    slider.locator(".noUi-handle").first.focus()
    for _ in range(presses):
        page.keyboard.press(key)
    return slider.locator(".widget-readout").first.inner_text()


def assert_no_errors(page):
    assert page.locator(ERRORS).count() == 0, page.locator(ERRORS).first.inner_text()
    assert page.get_by_text("Error displaying widget").count() == 0


def test_sampling_sliders_redraw_the_bars(page, lab, shots_dir):
    open_and_run_down_to(page, lab, "06_sampling.ipynb", "sampling_widget(")
    cell = widget_cell(page, "temperature")
    cell.screenshot(path=str(shots_dir / "06_sampling_before.png"))
    before = figure(cell)
    readout = move_slider(page, cell, "temperature", 6, "ArrowLeft")
    assert readout == "0.7"
    after_t = wait_for_new_figure(page, cell, before)
    readout = move_slider(page, cell, "top-p (1 off)", 10, "ArrowLeft")
    assert readout == "0.9"
    after_p = wait_for_new_figure(page, cell, after_t)
    assert len({before, after_t, after_p}) == 3
    cell.screenshot(path=str(shots_dir / "06_sampling_after.png"))
    assert_no_errors(page)


def test_attention_layer_and_head_selectors(page, lab, shots_dir):
    open_and_run_down_to(page, lab, "04_layers.ipynb", "attention_widget(")
    cell = widget_cell(page, "layer")
    cell.screenshot(path=str(shots_dir / "04_attention_before.png"))
    before = figure(cell)
    layer, head = int(readout(page, cell, "layer")), int(readout(page, cell, "head"))
    assert move_slider(page, cell, "layer", 3, "ArrowLeft") == str(layer - 3)
    after_layer = wait_for_new_figure(page, cell, before)
    assert move_slider(page, cell, "head", 2, "ArrowLeft") == str(head - 2)
    after_head = wait_for_new_figure(page, cell, after_layer)
    assert len({before, after_layer, after_head}) == 3
    cell.screenshot(path=str(shots_dir / "04_attention_after.png"))
    assert_no_errors(page)


def test_step_through_generation_button(page, lab, shots_dir):
    open_and_run_down_to(page, lab, "07_autoregressive.ipynb", "generation_widget(")
    cell = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-button:has-text('next token')")).first
    cell.scroll_into_view_if_needed()
    cell.locator(".widget-output img").first.wait_for(timeout=120_000)
    cell.screenshot(path=str(shots_dir / "07_step_before.png"))
    seen = [figure(cell)]
    for _ in range(3):
        cell.locator(".widget-button:has-text('next token')").click()
        seen.append(wait_for_new_figure(page, cell, seen[-1]))
    assert len(set(seen)) == 4
    cell.screenshot(path=str(shots_dir / "07_step_after.png"))
    assert_no_errors(page)


def test_a_request_outside_this_machine_is_refused_and_seen(browser, refuse_outside):
    """What the `page` fixture relies on: an image from a documentation address (192.0.2.1) is aborted before it is
    sent and its URL collected, while the data: URL beside it is not."""
    context = browser.new_context()
    outside = refuse_outside(context)
    page = context.new_page()
    page.set_content('<img src="http://192.0.2.1/llmwalk.png"><img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">')
    page.wait_for_load_state("load")
    context.close()
    assert outside == ["http://192.0.2.1/llmwalk.png"]


def test_chinese_edition_in_a_chinese_jupyterlab(page, lab_zh, shots_dir):
    """The Chinese twin of 06, opened in JupyterLab switched to 中文 (the language pack of the notebooks extra): the
    menus are Chinese, and so is the widget's own label, which comes from llmwalk/strings/zh/viz.toml."""
    from llmwalk.i18n import table
    open_and_run_down_to(page, lab_zh, "zh/06_sampling.ipynb", "sampling_widget(")
    menubar = page.locator(".lm-MenuBar-itemLabel")
    labels = [menubar.nth(i).inner_text() for i in range(menubar.count())]
    assert "文件" in labels and "编辑" in labels, f"JupyterLab's menus are not in Chinese: {labels}"
    temperature = table("zh")["viz.widgets.temperature"]
    cell = widget_cell(page, temperature)
    cell.screenshot(path=str(shots_dir / "zh_06_sampling.png"))
    assert_no_errors(page)
