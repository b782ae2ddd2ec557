"""`tandem`: opens Tandem's window. The full chat window arrives with issue [C]; until then a placeholder."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication, QLabel, QMainWindow

    app = QApplication.instance() or QApplication(sys.argv if argv is None else argv)
    window = QMainWindow()
    window.setWindowTitle("Tandem")
    label = QLabel(
        "Tandem's chat window is not built yet.\n\n"
        "Meanwhile the engine works from a terminal:\n"
        "python -m engine chat starter"
    )
    label.setAlignment(Qt.AlignmentFlag.AlignCenter)
    window.setCentralWidget(label)
    window.resize(720, 480)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
