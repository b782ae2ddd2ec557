"""MainWindow: saved chats | chat tabs | the current tab's sampler settings, with the model in the status bar.

+-----------+--------------------------------------+----------------+
| Sidebar   | QTabWidget of ChatTab (one job each) | SamplerPanel   |
| (search,  |                                      | (current tab)  |
|  chats)   |                                      |                |
+-----------+--------------------------------------+----------------+
| status: model name · load progress · last error                   |
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QCloseEvent, QDesktopServices, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QInputDialog,
    QLabel,
    QMainWindow,
    QProgressBar,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.service.app_server import AppServer
from app.service.catalog import models_dir
from app.service.remote_endpoints import saved_endpoint
from app.ui.about_dialog import AboutDialog, docs_url
from app.ui.backend_switch import BackendSwitch
from app.ui.chat_tab import DEFAULT_TITLE, ChatTab
from app.ui.message_view import warm_up_code_highlighting
from app.ui.remote_dialog import ask_remote
from app.ui.sampler_panel import SamplerPanel
from app.ui.server_panel import ServerPanel
from app.ui.shortcuts_dialog import PLACE_PROPERTY
from app.ui.sidebar import Sidebar
from app.ui.tasks import spawn
from app.ui.theme import follow_system
from app.ui.window_chats import ChatFiles
from app.ui.window_model import ModelSide

log = logging.getLogger(__name__)

_TAB_TITLE_LENGTH = 24
# Store settings this window keeps between runs.
OPEN_TABS_KEY = "ui.open_tabs"
CURRENT_TAB_KEY = "ui.current_tab"
GEOMETRY_KEY = "ui.geometry"
SPLITTER_KEY = "ui.splitter"
SAMPLER_PANEL_KEY = "ui.sampler_panel_shown"


class MainWindow(ChatFiles, ModelSide, QMainWindow):
    """Tandem's window over a Store and an EngineService (see app/ui/__init__.py for the layout)."""

    def __init__(self, store: Any, service: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.service = service
        # What chats answer with: the local engine, or a remote server (Model -> Use a remote server…).
        self.backends = BackendSwitch(service, self)
        self.backends.changed.connect(self._backend_changed)
        self._pending_prompt: str | None = None
        self._compare_view: QWidget | None = None
        self._model_manager: QWidget | None = None
        self.app_server = AppServer(store, service, self)  # the local OpenAI-compatible server (Server menu)
        self.app_server.restore()  # serving again if it was when the app last closed
        self._server_panel: ServerPanel | None = None
        self._restoring = False
        self.setWindowTitle("Tandem")
        follow_system(QApplication.instance())  # assets/style.qss in the system's light or dark colours

        self.sidebar = Sidebar(store)
        self.sidebar.open_requested.connect(self.open_chat)
        self.sidebar.delete_requested.connect(self.ask_delete_chat)
        self.sidebar.export_requested.connect(self.ask_export_chat)
        self.sidebar.new_chat_requested.connect(self.new_chat)
        self.tabs = QTabWidget()
        self.tabs.setTabsClosable(True)
        self.tabs.setMovable(True)
        self.tabs.setDocumentMode(True)
        self.tabs.tabCloseRequested.connect(self.close_tab)
        self.tabs.currentChanged.connect(self._current_changed)
        self.tabs.tabBarDoubleClicked.connect(self.ask_rename)
        self.sampler_panel = SamplerPanel(store)
        self.sampler_panel.settings_changed.connect(self._settings_edited)
        self.sampler_panel.overflow_changed.connect(
            lambda policy: (tab := self.current_tab()) is not None and tab.set_overflow(policy)
        )
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        for widget, stretch in ((self.sidebar, 0), (self.tabs, 1), (self.sampler_panel, 0)):
            self.splitter.addWidget(widget)
            self.splitter.setStretchFactor(self.splitter.count() - 1, stretch)
        self.splitter.setSizes([230, 700, 300])
        central = QWidget()  # banners (add_banner) above the splitter
        column = QVBoxLayout(central)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.splitter, 1)
        self.setCentralWidget(central)

        self.model_label = QLabel("No model")
        self.model_label.setObjectName("modelLabel")
        self.load_progress = QProgressBar()
        self.load_progress.setRange(0, 1000)
        self.load_progress.setMaximumWidth(220)
        self.load_progress.setVisible(False)
        self.error_label = QLabel()
        self.error_label.setObjectName("errorLabel")
        self.error_label.setWordWrap(True)
        self.statusBar().addWidget(self.model_label)
        self.statusBar().addWidget(self.load_progress)
        self.statusBar().addWidget(self.error_label, 1)

        self._build_actions()
        service.loading_started.connect(self._loading_started)
        service.loading_progress.connect(self._loading_progress)
        service.model_loaded.connect(self._model_loaded)
        service.load_failed.connect(self._load_failed)
        if service.is_loaded:
            self._model_loaded(service.model_name)
        self._restore()
        warm_up_code_highlighting()  # on a worker, while the user picks a model and types

    # --- actions --------------------------------------------------------------------------------------------

    def _build_actions(self) -> None:
        def action(menu: Any, text: str, slot: Any, shortcut: Any = None) -> QAction:
            a = QAction(text, self)
            if shortcut is not None:
                a.setShortcut(QKeySequence(shortcut))
            a.triggered.connect(slot)
            menu.addAction(a)
            self.addAction(a)  # shortcuts work while the menu bar is hidden too
            return a

        chat = self.menuBar().addMenu("&Chat")
        self.new_action = action(chat, "New chat", self.new_chat, QKeySequence.StandardKey.AddTab)
        self.close_action = action(chat, "Close chat", lambda: self.close_tab(self.tabs.currentIndex()), "Ctrl+W")
        self.rename_action = action(chat, "Rename…", lambda: self.ask_rename(self.tabs.currentIndex()), "F2")
        self.stop_action = action(chat, "Stop answer", self._stop_current, Qt.Key.Key_Escape)
        # On the message with the focus, else the lowest one with versions (ChatTab.step_version).
        self.previous_version_action = action(chat, "Previous version", lambda: self._step_version(-1), "Alt+Left")
        self.next_version_action = action(chat, "Next version", lambda: self._step_version(+1), "Alt+Right")
        chat.addSeparator()
        action(chat, "Export as Markdown…", lambda: self._export_current("markdown"))
        action(chat, "Export as JSON…", lambda: self._export_current("json"))
        chat.addSeparator()
        action(chat, "Quit", self.close, QKeySequence.StandardKey.Quit)

        model = self.menuBar().addMenu("&Model")
        action(model, "Open model file or folder…", self.ask_open_model, "Ctrl+O")
        if _module_exists("app.ui.model_manager"):
            action(model, "Model manager…", self.show_model_manager)
        action(model, "Use a remote server…", lambda: ask_remote(self, saved_endpoint(self.store)))
        action(self.menuBar().addMenu("&Server"), "Local server…", self.show_server_panel)
        view = self.menuBar().addMenu("&View")
        # Hidden, the chat takes the room; Jan and LM Studio fold their settings the same way.
        self.sampler_panel_action = action(view, "Sampler settings panel", self.set_sampler_panel_shown, "Ctrl+Shift+S")
        self.sampler_panel_action.setCheckable(True)
        self.sampler_panel_action.setChecked(True)
        if _module_exists("app.ui.compare_view"):
            action(view, "Compare settings side by side…", self.show_compare_view)
            # Added to the compare window alone (show_compare_view): here Enter belongs to the message box.
            self.compare_run_action = QAction("Run the comparison", self)
            self.compare_run_action.setShortcuts([QKeySequence("Ctrl+Return"), QKeySequence("Ctrl+Enter")])
            self.compare_run_action.setProperty(PLACE_PROPERTY, "Compare window")
            self.compare_run_action.triggered.connect(lambda: self._compare_view and self._compare_view.start())
            self.compare_close_action = QAction("Close the compare window", self)
            self.compare_close_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
            self.compare_close_action.setProperty(PLACE_PROPERTY, "Compare window")
            self.compare_close_action.triggered.connect(lambda: self._compare_view and self._compare_view.close())
        help_menu = self.menuBar().addMenu("&Help")
        action(help_menu, "Keyboard shortcuts", self.show_shortcuts, QKeySequence.StandardKey.HelpContents)
        self.docs_action = action(help_menu, "Documentation", self.open_docs)
        self.docs_action.setEnabled(docs_url() is not None)
        action(help_menu, "About Tandem", self.show_about)

    def set_sampler_panel_shown(self, shown: bool) -> None:
        """Show or hide the sampler settings panel (View menu, Ctrl+Shift+S); remembered between runs."""
        self.sampler_panel.setVisible(shown)
        sizes = self.splitter.sizes()
        if shown and sizes[2] == 0:  # hidden when the layout was saved: it comes back at its usual width
            panel = max(self.sampler_panel.sizeHint().width(), 300)
            self.splitter.setSizes([sizes[0], max(sizes[1] - panel, 0), panel])
        if self.sampler_panel_action.isChecked() != shown:
            self.sampler_panel_action.setChecked(shown)
        if not self._restoring:
            self.store.set_setting(SAMPLER_PANEL_KEY, bool(shown))

    def show_about(self) -> AboutDialog:
        """Help -> About Tandem: version, models and data folders, licence, docs."""
        dialog = AboutDialog(models_dir(), self.store.data_dir, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def open_docs(self) -> None:
        url = docs_url()
        if url is not None:
            QDesktopServices.openUrl(url)

    def _step_version(self, step: int) -> None:
        tab = self.current_tab()
        if tab is not None:
            tab.step_version(step)

    # --- tabs -----------------------------------------------------------------------------------------------

    def chat_tabs(self) -> list[ChatTab]:
        return [self.tabs.widget(i) for i in range(self.tabs.count())]

    def current_tab(self) -> ChatTab | None:
        return self.tabs.currentWidget()

    def tab_for(self, chat_id: int) -> ChatTab | None:
        return next((t for t in self.chat_tabs() if t.chat_id == chat_id), None)

    def new_chat(self) -> ChatTab:
        """Create a chat (with the current tab's settings) and open it in a new tab."""
        current = self.current_tab()
        return self._create_chat(current.settings() if current is not None else self._default_settings())

    def new_prompt_chat(self) -> ChatTab:
        """Create a chat with the default settings for a prompt given on the command line, and open it.

        Such a prompt never goes into a chat the user had open: that chat's settings (JSON mode, a seed, a
        system prompt) were chosen for its own conversation, and its history would become the prompt's.
        """
        return self._create_chat(self._default_settings())

    def _create_chat(self, settings: dict) -> ChatTab:
        chat = self.store.create_chat(DEFAULT_TITLE, settings=settings)
        self.sidebar.refresh()
        return self.open_chat(chat.id)

    def open_chat(self, chat_id: int) -> ChatTab:
        """Show the chat's tab, opening it if needed."""
        tab = self.tab_for(chat_id)
        if tab is None:
            tab = ChatTab(self.store, self.backends.current, chat_id)
            tab.title_changed.connect(self._title_changed)
            tab.streaming_changed.connect(self._streaming_changed)
            tab.chat_changed.connect(lambda _id: self.sidebar.refresh())
            tab.vision_model_wanted.connect(self.show_model_manager)
            index = self.tabs.addTab(tab, _short(tab.title))
            self.tabs.setTabToolTip(index, tab.title)
        self.tabs.setCurrentWidget(tab)
        tab.input.setFocus()
        self._save_tabs()
        return tab

    def close_tab(self, index: int) -> None:
        """Close a tab: its answer is stopped (and kept); a chat with no messages and no draft is discarded."""
        tab = self.tabs.widget(index)
        if tab is None:
            return
        self.tabs.removeTab(index)
        spawn(self._dispose(tab), name=f"close-chat-{tab.chat_id}")
        if self.tabs.count() == 0:
            self.new_chat()
        self._save_tabs()

    async def _dispose(self, tab: ChatTab, delete: bool = False) -> None:
        if not delete:
            tab.save_draft()  # a chat with only a message being written is kept, with it
        await tab.shutdown()
        tab.deleteLater()
        try:
            if delete or not (self.store.messages(tab.chat_id) or self.store.draft(tab.chat_id)):
                self.store.delete_chat(tab.chat_id)
        except KeyError:
            pass  # already gone
        self.sidebar.refresh()

    def rename_chat(self, chat_id: int, title: str) -> None:
        tab = self.tab_for(chat_id)
        if tab is not None:
            tab.rename(title)
        elif title.strip():
            self.store.rename_chat(chat_id, " ".join(title.split()))
        self.sidebar.refresh()

    def ask_rename(self, index: int) -> None:
        tab = self.tabs.widget(index)
        if tab is None:
            return
        dialog = QInputDialog(self)
        dialog.setWindowTitle("Rename chat")
        dialog.setLabelText("Title:")
        dialog.setTextValue(tab.title)
        dialog.textValueSelected.connect(lambda title: self.rename_chat(tab.chat_id, title))
        dialog.open()  # not exec(): a nested event loop would re-enter running asyncio tasks

    def _title_changed(self, chat_id: int, title: str) -> None:
        tab = self.tab_for(chat_id)
        if tab is not None:
            index = self.tabs.indexOf(tab)
            self.tabs.setTabText(index, ("● " if tab.is_streaming else "") + _short(title))
            self.tabs.setTabToolTip(index, title)
            if tab is self.current_tab():  # a chat names itself after its first message while it is shown
                self.setWindowTitle(f"{title} — Tandem")

    def _streaming_changed(self, chat_id: int, streaming: bool) -> None:
        tab = self.tab_for(chat_id)
        if tab is not None:
            self._title_changed(chat_id, tab.title)

    def _current_changed(self, index: int) -> None:
        tab = self.tabs.widget(index)
        if tab is not None:
            self.sampler_panel.set_settings(tab.settings())
            self.sampler_panel.set_overflow(tab.overflow)
            self.setWindowTitle(f"{tab.title} — Tandem")
        self._save_tabs()

    def _settings_edited(self, settings: dict) -> None:
        tab = self.current_tab()
        if tab is not None:
            tab.set_settings(settings)

    def _default_settings(self) -> dict:
        presets = {p.name: p.settings for p in self.store.presets.all()}
        return dict(presets.get("Balanced", {}))

    def _stop_current(self) -> None:
        tab = self.current_tab()
        if tab is not None:
            tab.stop()

    def add_banner(self, banner: QWidget) -> None:
        """Put a notice (app/ui/first_run.py) above the chats; it shows and hides itself."""
        self.centralWidget().layout().insertWidget(0, banner)

    def show_error(self, message: str) -> None:
        """Show an error in the status bar until the next one (the window keeps working)."""
        log.warning("%s", message)
        self.error_label.setText(message)
        self.error_label.setToolTip(message)

    def send_prompt(self, text: str) -> None:
        """Send `text` in a new chat with the default settings, once a model is loaded (`tandem --prompt`)."""
        if not self.backends.current.is_loaded:
            self._pending_prompt = text
            return
        tab = self.new_prompt_chat()
        tab.input.setPlainText(text)
        tab.send()

    # --- state between runs ---------------------------------------------------------------------------------

    def _restore(self) -> None:
        geometry = self.store.get_setting(GEOMETRY_KEY)
        if isinstance(geometry, str):
            self.restoreGeometry(QByteArray.fromBase64(geometry.encode("ascii")))
        else:
            self.resize(1240, 780)
        splitter = self.store.get_setting(SPLITTER_KEY)
        if isinstance(splitter, str):
            self.splitter.restoreState(QByteArray.fromBase64(splitter.encode("ascii")))
        current = self.store.get_setting(CURRENT_TAB_KEY)
        opened = False
        self._restoring = True
        self.set_sampler_panel_shown(self.store.get_setting(SAMPLER_PANEL_KEY, True) is not False)
        for chat_id in self.store.get_setting(OPEN_TABS_KEY, []) or []:
            try:
                self.open_chat(int(chat_id))
                opened = True
            except (KeyError, ValueError, TypeError):
                log.info("chat %r from the last session is gone", chat_id)
        self._restoring = False
        if not opened:
            self.new_chat()
        if isinstance(current, int) and self.tab_for(current) is not None:
            self.tabs.setCurrentWidget(self.tab_for(current))

    def _save_tabs(self) -> None:
        if self._restoring:
            return
        self.store.set_setting(OPEN_TABS_KEY, [t.chat_id for t in self.chat_tabs()])
        current = self.current_tab()
        self.store.set_setting(CURRENT_TAB_KEY, current.chat_id if current is not None else None)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        # The loop may stop right after this: save what is streaming now instead of waiting for the jobs.
        for tab in self.chat_tabs():
            tab.flush()
            tab.stop()
        self._save_tabs()
        self.store.set_setting(GEOMETRY_KEY, bytes(self.saveGeometry().toBase64()).decode("ascii"))
        self.store.set_setting(SPLITTER_KEY, bytes(self.splitter.saveState().toBase64()).decode("ascii"))
        for window in (self._compare_view, self._model_manager):
            if window is not None:
                window.close()
        self.app_server.close()  # quitting: cut its streams now; it starts again with the app
        super().closeEvent(event)


def _short(title: str) -> str:
    return title if len(title) <= _TAB_TITLE_LENGTH else title[: _TAB_TITLE_LENGTH - 1] + "…"


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
