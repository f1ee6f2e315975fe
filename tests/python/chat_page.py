"""Drives `inkling-wgpu serve`'s chat page (`/`) in headless Chromium through Selenium's WebDriver
(tests/suite/serve/chat_page.rs runs it).

    python chat_page.py http://127.0.0.1:PORT SCREENSHOT.png

Loads the page, sets a system prompt, effort `none`, temperature 0 and 60 max tokens, sends one message, waits for
the streamed answer and its stats line, checks the stop button is disabled again, saves a
screenshot, and prints one JSON line: the answer text, the stats line, the model id shown. Chromium
and its driver: `CHROMIUM` / `CHROMEDRIVER` when set, else Debian's /usr/bin/chromium and
/usr/bin/chromedriver (never downloaded). Exits non-zero with the reason on any failure.
"""

import json
import os
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait


def main():
    url, shot = sys.argv[1], sys.argv[2]
    # a third argument: the message to send with the page's default effort and temperature
    # (how README's screenshot was taken)
    message = sys.argv[3] if len(sys.argv) > 3 else None
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,700"):
        opts.add_argument(a)
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(options=opts, service=service)
    try:
        driver.get(url + "/")
        wait = WebDriverWait(driver, 120)
        assert driver.title == "inkling-wgpu chat", driver.title
        wait.until(lambda d: d.find_element(By.ID, "model").text != "")
        model = driver.find_element(By.ID, "model").text
        box = driver.find_element(By.ID, "input")
        if message is None:
            driver.find_element(By.ID, "system").send_keys("You are terse.")
            Select(driver.find_element(By.ID, "effort")).select_by_value("none")
            driver.find_element(By.ID, "temperature").send_keys("0")
            max_tokens = driver.find_element(By.ID, "max_tokens")
            max_tokens.clear()
            max_tokens.send_keys("60")
            box.send_keys("Hello there")
        else:
            box.send_keys(message)
        driver.find_element(By.ID, "send").click()
        # the stats line is written when the stream has ended
        wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, ".model .stats"), "]"))
        answer = driver.find_element(By.CSS_SELECTOR, ".model .answer").text
        stats = driver.find_element(By.CSS_SELECTOR, ".model .stats").text
        user = driver.find_element(By.CSS_SELECTOR, ".user").text
        errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".error")]
        stop_disabled = driver.find_element(By.ID, "stop").get_attribute("disabled") is not None
        send_enabled = driver.find_element(By.ID, "send").is_enabled()
        os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
        driver.save_screenshot(shot)
        print(json.dumps(dict(model=model, user=user, answer=answer, stats=stats, errors=errors,
                              stop_disabled=stop_disabled, send_enabled=send_enabled)))
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
